/**
 * Loader for an edgetune export inside an Android app (onnxruntime-android).
 *
 * Flow: [EdgetuneSession.open] copies the asset folder (config.json, models/, golden/) into
 * `filesDir` once (again whenever config.json changes), fingerprints this device the way
 * edgetune's native agent does, picks the best matching device entry of config.json and its
 * tuned configuration for the shape point (else the export's fallback), checks the sha256 of
 * every file that configuration uses, and opens an onnxruntime session with its settings.
 * [EdgetuneSession.selfTest] runs the golden inputs and compares against the golden outputs.
 *
 * ```
 * EdgetuneSession.open(context, shapeKey = "x=1x16", minMatch = Match.HARDWARE).use { s ->
 *     check(s.selfTest().ok) { "edgetune self-test failed on ${s.configId}" }
 *     OnnxTensor.createTensor(OrtEnvironment.getEnvironment(), input, longArrayOf(1, 16))
 *         .use { x -> s.run(mapOf("x" to x)).use { r -> /* r.get("y") */ } }
 * }
 * ```
 */
package dev.edgetune

import ai.onnxruntime.*
import ai.onnxruntime.OrtSession.SessionOptions
import android.content.Context
import android.content.res.AssetManager
import android.os.Build
import android.system.Os
import org.json.JSONArray
import org.json.JSONObject
import java.io.*
import java.nio.*
import java.security.MessageDigest
import kotlin.math.*

/** How closely the chosen device entry matches this device; FALLBACK means the export's fallback config. */
enum class Match { FALLBACK, HARDWARE, EXACT }

data class OutputCheck(val name: String, val ok: Boolean, val maxAbs: Double, val normRel: Double,
                       val worstRatio: Double, val cosine: Double)

data class SelfTestReport(val ok: Boolean, val outputs: List<OutputCheck>)

class EdgetuneSession private constructor(
    private val dir: File, private val env: OrtEnvironment, private val options: SessionOptions,
    private val session: OrtSession, private val point: JSONObject, private val accuracy: JSONObject?,
    val match: Match, val device: String?, val configId: String, val label: String
) : AutoCloseable {

    fun run(inputs: Map<String, OnnxTensor>): OrtSession.Result = session.run(inputs)

    /** Runs the shape point's golden inputs and checks every output against its golden output. */
    fun selfTest(): SelfTestReport {
        val golden = point.optJSONObject("golden") ?: error("shape point ${point.getString("shape_key")} has no golden data")
        val inFiles = golden.getJSONArray("inputs")
        val outFiles = golden.getJSONArray("outputs")
        val tolerances = golden.optJSONArray("tolerance")
        val inputs = point.getJSONArray("inputs").objects().mapIndexed { i, spec ->
            spec.getString("name") to Npy.read(dir.inside(inFiles.getString(i))).tensor(env)
        }.toMap()
        try {
            return session.run(inputs).use { result ->
                val checks = point.getJSONArray("outputs").objects().mapIndexed { i, spec ->
                    val name = spec.getString("name")
                    val y = (result.get(name).orElse(null) as? OnnxTensor ?: error("the session returned no tensor '$name'")).doubles()
                    val ref = Npy.read(dir.inside(outFiles.getString(i)))
                    compare(name, y, ref.doubles(), tolerances?.optJSONObject(i), ref.dtype)
                }
                SelfTestReport(checks.all { it.ok }, checks)
            }
        } finally {
            inputs.values.forEach { it.close() }
        }
    }

    /** edgetune's rule (edgetune/verify.py compare), or the accuracy budget of an approximate config. */
    private fun compare(name: String, y: DoubleArray, r: DoubleArray, tol: JSONObject?, dtype: String): OutputCheck {
        val inf = Double.POSITIVE_INFINITY
        if (y.size != r.size) return OutputCheck(name, false, inf, inf, inf, 0.0)
        val diff = DoubleArray(r.size) { i ->
            val d = if (r[i].isFinite()) abs(y[i] - r[i]) else if (y[i] == r[i]) 0.0 else inf
            if (d.isNaN()) inf else d
        }
        val rf = DoubleArray(r.size) { if (r[it].isFinite()) r[it] else 0.0 }
        val ss = rf.fold(0.0) { a, v -> a + v * v }
        val scale = if (r.isEmpty()) 0.0 else sqrt(ss / r.size)
        val maxAbs = diff.fold(0.0) { a, v -> maxOf(a, v) }
        val dn = if (diff.all { it.isFinite() }) sqrt(diff.fold(0.0) { a, v -> a + v * v }) else inf
        val rnorm = sqrt(ss)
        val normRel = if (rnorm > 0) dn / rnorm else if (dn == 0.0) 0.0 else inf
        val (atol, rtol, norm) = when {
            tol != null -> Triple(tol.optDouble("atol", 0.0), tol.optDouble("rtol", 0.0), tol.optDouble("norm", 0.0))
            dtype == "<f4" -> Triple(2e-4, 1e-4, 1e-4)
            dtype == "<f8" -> Triple(1e-6, 1e-6, 1e-7)
            else -> Triple(0.0, 0.0, 0.0) // integers and bools must match exactly
        }
        val worst = diff.indices.fold(0.0) { w, i -> if (diff[i] == 0.0) w else maxOf(w, diff[i] / (atol * scale + rtol * abs(rf[i]))) }
        val cos = cosine(y, r)
        val ok = if (accuracy != null) { // top1 is a whole-data-set metric: not checked on one sample
            (accuracy.isNull("cosine") || cos >= accuracy.getDouble("cosine")) &&
                (accuracy.isNull("max_abs") || maxAbs <= accuracy.getDouble("max_abs"))
        } else worst <= 1.0 && normRel <= norm
        return OutputCheck(name, ok, maxAbs, normRel, worst, cos)
    }

    override fun close() {
        session.close()
        options.close()
    }

    companion object {
        const val SCHEMA = "edgetune.config/1"

        /** Copies the asset folder [assetDir] to `filesDir/<assetDir>` (when config.json changed) and opens it. */
        fun open(context: Context, assetDir: String = "edgetune", shapeKey: String? = null,
                 minMatch: Match = Match.FALLBACK): EdgetuneSession {
            val target = File(context.filesDir, assetDir)
            val want = context.assets.open("$assetDir/config.json").use(::sha256)
            val have = File(target, "config.json").takeIf { it.isFile }?.let { f -> f.inputStream().use(::sha256) }
            if (want != have) {
                val tmp = File(context.filesDir, "$assetDir.tmp").apply { deleteRecursively() }
                copyAssets(context.assets, assetDir, tmp)
                target.deleteRecursively()
                check(tmp.renameTo(target)) { "cannot move $tmp to $target" }
            }
            return openDir(target, shapeKey, minMatch)
        }

        /** Opens an export laid out in a plain directory. */
        fun openDir(dir: File, shapeKey: String? = null, minMatch: Match = Match.FALLBACK): EdgetuneSession {
            val cfg = JSONObject(File(dir, "config.json").readText())
            val schema = cfg.str("schema")
            check(schema == SCHEMA) { "$dir/config.json has schema '$schema'; this loader reads only $SCHEMA" }
            val shapes = cfg.getJSONArray("shapes").objects()
            val key = shapeKey ?: shapes.firstOrNull()?.getString("shape_key") ?: error("config.json lists no shape points")
            val point = shapes.firstOrNull { it.getString("shape_key") == key }
                ?: error("no shape point '$key' in config.json (known: ${shapes.joinToString { it.getString("shape_key") }})")

            val fp = Fingerprint.collect()
            var best: JSONObject? = null
            var level = Match.FALLBACK
            for (d in cfg.getJSONArray("devices").objects()) {
                val m = fp.match(d.optJSONObject("fingerprint"))
                if (m > level) { best = d; level = m }
            }
            val selected = best?.optJSONArray("selected").objects().firstOrNull { it.str("shape_key") == key }
            val match = if (selected != null) level else Match.FALLBACK // the best device was not tuned at this point
            if (match < minMatch) error(if (best != null && selected == null)
                "this device matches '${best.str("name")}' at the '${level.lc}' level, but that device was not tuned at shape point $key"
            else "this device (cpu model '${fp.cpuModel}', ${fp.arch}, ${fp.cores} cores) matches none of the export's " +
                "devices at the '${minMatch.lc}' level (best: '${match.lc}')")
            val configId = selected?.str("config") ?: cfg.optJSONObject("fallback")?.str("config")
                ?: error("config.json has no fallback configuration")
            val c = cfg.getJSONObject("configs").optJSONObject(configId) ?: error("config '$configId' is not in config.json")
            check(c.str("runtime") == "onnxruntime") { "config '$configId' needs runtime '${c.str("runtime")}'; this loader runs only onnxruntime" }

            // every file the configuration reads is checked against config.json's sha256 (check_files, listed)
            val files = c.optJSONArray("files").objects()
            check(files.isNotEmpty()) { "config.json: configuration '$configId' lists no files" }
            for (f in files) {
                val path = f.str("path")
                val file = dir.inside(path)
                val sum = f.str("sha256")?.takeIf { SHA256_HEX.matches(it) } ?: error("config.json: file '$path' has no sha256")
                check(file.isFile) { "config '$configId': file $path is missing from $dir" }
                val got = file.inputStream().use(::sha256)
                check(got.equals(sum, ignoreCase = true)) { "config '$configId': file $path is altered (sha256 $got, expected $sum)" }
            }
            fun listed(what: String, path: String) = dir.inside(path).also {
                check(files.any { f -> f.str("path") == path }) {
                    "configuration '$configId': its $what is not among the files whose sha256 config.json lists"
                }
            }
            val model = listed("model", c.str("model") ?: error("config '$configId' names no model"))
            val opsLib = c.str("custom_ops_library")?.let { listed("custom-op library", it) }

            val env = OrtEnvironment.getEnvironment()
            val options = SessionOptions()
            try {
                configure(options, c, configId, opsLib)
                val session = env.createSession(model.path, options)
                return EdgetuneSession(dir, env, options, session, point, selected?.optJSONObject("accuracy"),
                    match, if (selected != null) best?.str("name") else null, configId, c.str("label") ?: configId)
            } catch (e: Throwable) {
                options.close()
                throw e
            }
        }

        private fun configure(o: SessionOptions, c: JSONObject, id: String, opsLib: File?) {
            c.int("intra_op_num_threads")?.let(o::setIntraOpNumThreads)
            c.int("inter_op_num_threads")?.let(o::setInterOpNumThreads)
            c.int("graph_optimization_level")?.let { lvl ->
                o.setOptimizationLevel(when (lvl) {
                    0 -> SessionOptions.OptLevel.NO_OPT
                    1 -> SessionOptions.OptLevel.BASIC_OPT
                    2 -> SessionOptions.OptLevel.EXTENDED_OPT
                    99 -> SessionOptions.OptLevel.ALL_OPT
                    else -> error("config '$id': graph_optimization_level $lvl is not 0, 1, 2 or 99")
                })
            }
            c.str("execution_mode")?.let { mode ->
                o.setExecutionMode(when (mode) {
                    "sequential" -> SessionOptions.ExecutionMode.SEQUENTIAL
                    "parallel" -> SessionOptions.ExecutionMode.PARALLEL
                    else -> error("config '$id': execution_mode '$mode' is not sequential or parallel")
                })
            }
            c.optJSONObject("session_config")?.strings()?.forEach { (k, v) -> o.addConfigEntry(k, v) }
            // only the sha256-checked copy inside the export is loaded, as the C loader does
            opsLib?.let { o.registerCustomOpLibrary(it.path) }
            val providerOptions = c.optJSONObject("provider_options")?.strings() ?: emptyMap()
            when (val ep = c.str("execution_provider") ?: "CPUExecutionProvider") {
                "CPUExecutionProvider" -> Unit
                "XnnpackExecutionProvider" -> o.addXnnpack(providerOptions)
                // the Java API takes NNAPI flags as an EnumSet, not provider options: these are ignored
                "NnapiExecutionProvider" -> o.addNnapi()
                "QNNExecutionProvider" -> o.addQnn(providerOptions)
                else -> error("execution provider $ep is not one the loader can append")
            }
        }

        private fun copyAssets(am: AssetManager, path: String, to: File) {
            val children = am.list(path).orEmpty()
            if (children.isEmpty()) {
                to.parentFile?.mkdirs()
                am.open(path).use { i -> to.outputStream().use { i.copyTo(it) } }
            } else children.forEach { copyAssets(am, "$path/$it", File(to, it)) }
        }
    }
}

/** The device fingerprint, read as device_agents/native/fingerprint.c does: the native agent's readings, plus the
 *  Python agent's where they differ (cpu model, soc, online cores). */
private class Fingerprint(val arch: String, val cpuModel: String, val cpuModelPy: String, val soc: String?,
                          val socPy: String?, val cores: Int, val coresOnline: Int, val maxFreqKhz: List<Long>,
                          val kernel: String, val os: String, val governor: String?, val emulated: String?) {

    /** ld_match_level of loader_config.c. */
    fun match(d: JSONObject?): Match {
        if (d == null) return Match.FALLBACK
        val model = d.str("cpu_model")
        val freqs = d.optJSONArray("max_freq_khz")?.let { a -> List(a.length()) { a.getLong(it) } } // absent: not compared
        if (d.str("arch") != arch || (model != cpuModel && model != cpuModelPy) || d.int("cores").let { it != cores && it != coresOnline } ||
            (freqs != null && freqs != maxFreqKhz)) return Match.FALLBACK
        fun same(k: String, v: String?) = (d.str(k) ?: "") == (v ?: "")
        return if (same("kernel", kernel) && same("os", os) && same("governor", governor) && same("emulated", emulated) &&
            (same("soc", soc) || same("soc", socPy))) Match.EXACT else Match.HARDWARE
    }

    companion object {
        private val PROP_FILES = listOf("/system/build.prop", "/vendor/build.prop", "/odm/etc/build.prop", "/product/etc/build.prop")

        fun collect(): Fingerprint {
            val uname = runCatching { Os.uname() }.getOrNull()
            val arch = uname?.machine ?: System.getProperty("os.arch").orEmpty().let { if (it == "amd64") "x86_64" else it }
            val kernel = read("/proc/sys/kernel/osrelease")?.trim() ?: uname?.release ?: System.getProperty("os.version").orEmpty()
            val cpuinfo = read("/proc/cpuinfo").orEmpty()
            var model = listOf("model name", "Processor", "cpu model").asSequence().mapNotNull { field(cpuinfo, it, ':') }.firstOrNull() ?: ""
            if (model.isEmpty() || model == "AArch64 Processor") {
                val impl = field(cpuinfo, "CPU implementer", ':')
                val part = field(cpuinfo, "CPU part", ':')
                if (impl != null && part != null) model = "implementer $impl part $part"
            }
            val propsReadable = PROP_FILES.any { File(it).canRead() }
            // the native agent reads build.prop; Build.* stands in only where an app cannot
            val soc = field(cpuinfo, "Hardware", ':')?.ifEmpty { null } ?: if (propsReadable) {
                prop("ro.soc.model") ?: prop("ro.board.platform")
            } else {
                (if (Build.VERSION.SDK_INT >= 31) Build.SOC_MODEL else null)?.takeUnless { it.isEmpty() || it == Build.UNKNOWN }
                    ?: Build.BOARD?.takeUnless { it.isEmpty() || it == Build.UNKNOWN }
            }
            val os = read("/etc/os-release")?.let { field(it, "PRETTY_NAME", '=') }?.ifEmpty { null } ?: if (propsReadable) {
                prop("ro.build.version.release")?.let { r ->
                    (prop("ro.build.fingerprint") ?: prop("ro.build.id"))?.let { "Android $r ($it)" } ?: "Android $r"
                } ?: uname?.sysname ?: "Linux"
            } else "Android ${Build.VERSION.RELEASE} (${Build.FINGERPRINT})"
            val online = Runtime.getRuntime().availableProcessors() // os.cpu_count() of the Python agent
            val cores = File("/sys/devices/system/cpu").listFiles()?.count { it.isDirectory && CPU_DIR.matches(it.name) }
                ?.takeIf { it > 0 } ?: online
            val freqs = (0 until cores).mapNotNull { i ->
                read("/sys/devices/system/cpu/cpu$i/cpufreq/cpuinfo_max_freq")
                    ?.let { LEADING_INT.find(it)?.groupValues?.get(1)?.toLongOrNull() }?.takeIf { it >= 0 }
            }
            val governor = read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")?.trim()?.ifEmpty { null }
            val (modelPy, socPy) = pythonReading(cpuinfo)
            return Fingerprint(arch, model.ifEmpty { arch }, modelPy.ifEmpty { arch }, soc, socPy, cores, online, freqs,
                kernel, os, governor, System.getenv("EDGETUNE_EMULATED")?.ifEmpty { null })
        }

        private val CPU_DIR = Regex("cpu[0-9]+")
        private val PY_KEYS = listOf("model name", "cpu model", "processor")
        private val LEADING_INT = Regex("^\\s*([+-]?[0-9]+)")

        /** The Python agent's model (first "model name"/"cpu model"/"processor" value that is not a number, else
         *  the CPU parts) and soc (the last "Hardware" value, null when there is none). */
        private fun pythonReading(cpuinfo: String): Pair<String, String?> {
            var model: String? = null
            var hardware: String? = null
            val parts = sortedSetOf<String>()
            for (line in cpuinfo.split('\n')) {
                val key = line.substringBefore(':').trim().lowercase()
                val value = line.substringAfter(':', "").trim()
                when {
                    key in PY_KEYS && model == null && value.isNotEmpty() && !value.all { it in '0'..'9' } -> model = value
                    key == "hardware" -> hardware = value
                    key == "cpu part" -> parts += value
                }
            }
            return (model ?: if (parts.isEmpty()) "" else "ARM CPU part " + parts.joinToString("/")) to hardware
        }

        /** First `key <spaces> sep value` line, value trimmed and unquoted (et_field). */
        private fun field(text: String, key: String, sep: Char): String? {
            for (line in text.split('\n')) {
                if (!line.startsWith(key)) continue
                val rest = line.substring(key.length).trimStart(' ', '\t')
                if (rest.isEmpty() || rest[0] != sep) continue
                val v = rest.substring(1).trim()
                return if (v.length >= 2 && v.startsWith('"') && v.endsWith('"')) v.substring(1, v.length - 1) else v
            }
            return null
        }

        private fun prop(key: String): String? =
            PROP_FILES.asSequence().mapNotNull { f -> read(f)?.let { field(it, key, '=') } }.firstOrNull { it.isNotEmpty() }

        private fun read(path: String): String? =
            runCatching { FileInputStream(path).bufferedReader().use { it.readText() } }.getOrNull()
    }
}

/** A .npy array (format 1.0/2.0, little-endian, C order) in a direct native-order buffer. */
private class Npy(val dtype: String, val shape: LongArray, val data: ByteBuffer) {
    val count = shape.fold(1L) { a, b -> a * b }.toInt()

    fun tensor(env: OrtEnvironment): OnnxTensor = when (dtype) {
        "<f4" -> OnnxTensor.createTensor(env, data.asFloatBuffer(), shape)
        "<f8" -> OnnxTensor.createTensor(env, data.asDoubleBuffer(), shape)
        "<i4" -> OnnxTensor.createTensor(env, data.asIntBuffer(), shape)
        "<i8" -> OnnxTensor.createTensor(env, data.asLongBuffer(), shape)
        "|i1" -> OnnxTensor.createTensor(env, data, shape, OnnxJavaType.INT8)
        "|u1" -> OnnxTensor.createTensor(env, data, shape, OnnxJavaType.UINT8)
        else -> OnnxTensor.createTensor(env, data, shape, OnnxJavaType.BOOL)
    }

    fun doubles(): DoubleArray = when (dtype) {
        "<f4" -> data.asFloatBuffer().let { b -> DoubleArray(count) { b.get(it).toDouble() } }
        "<f8" -> data.asDoubleBuffer().let { b -> DoubleArray(count) { b.get(it) } }
        "<i4" -> data.asIntBuffer().let { b -> DoubleArray(count) { b.get(it).toDouble() } }
        "<i8" -> data.asLongBuffer().let { b -> DoubleArray(count) { b.get(it).toDouble() } }
        "|u1" -> DoubleArray(count) { (data.get(it).toInt() and 0xff).toDouble() }
        else -> DoubleArray(count) { data.get(it).toDouble() }
    }

    companion object {
        private val SIZES = mapOf("<f4" to 4, "<f8" to 8, "<i4" to 4, "<i8" to 8, "|i1" to 1, "|u1" to 1, "|b1" to 1)

        fun read(file: File): Npy {
            val b = ByteBuffer.wrap(file.readBytes()).order(ByteOrder.LITTLE_ENDIAN)
            require(b.remaining() >= 10 && String(b.array(), 0, 6, Charsets.ISO_8859_1) == "\u0093NUMPY") { "$file is not a .npy file" }
            b.position(6)
            val major = b.get().toInt().also { b.get() }
            val len = when (major) { 1 -> b.short.toInt() and 0xffff; 2 -> b.int; else -> error("$file: .npy format $major is not supported") }
            val header = String(b.array(), b.position(), len, Charsets.ISO_8859_1)
            b.position(b.position() + len)
            fun entry(k: String, v: String) = Regex("'$k'\\s*:\\s*$v").find(header)?.groupValues?.get(1) ?: error("$file: no '$k' in header")
            val dtype = entry("descr", "'([^']*)'")
            val size = SIZES[dtype] ?: error("$file: dtype $dtype is not supported")
            require(entry("fortran_order", "(True|False)") == "False") { "$file: fortran_order arrays are not supported" }
            val shape = entry("shape", "\\(([^)]*)\\)").split(',').map { it.trim() }.filter { it.isNotEmpty() }.map { it.toLong() }.toLongArray()
            val n = shape.fold(1L) { a, c -> a * c }.toInt()
            require(b.remaining() >= n * size) { "$file: data is shorter than its shape ${shape.toList()}" }
            val src = b.slice().order(ByteOrder.LITTLE_ENDIAN).apply { limit(n * size) }
            val out = ByteBuffer.allocateDirect(n * size).order(ByteOrder.nativeOrder())
            when (size) { // typed copies turn little-endian into native order
                8 -> if (dtype == "<f8") out.asDoubleBuffer().put(src.asDoubleBuffer()) else out.asLongBuffer().put(src.asLongBuffer())
                4 -> if (dtype == "<f4") out.asFloatBuffer().put(src.asFloatBuffer()) else out.asIntBuffer().put(src.asIntBuffer())
                else -> out.duplicate().put(src)
            }
            return Npy(dtype, shape, out)
        }
    }
}

private fun OnnxTensor.doubles(): DoubleArray = when (info.type) {
    OnnxJavaType.FLOAT -> floatBuffer.let { b -> DoubleArray(b.remaining()) { b.get(it).toDouble() } }
    OnnxJavaType.DOUBLE -> doubleBuffer.let { b -> DoubleArray(b.remaining()) { b.get(it) } }
    OnnxJavaType.INT32 -> intBuffer.let { b -> DoubleArray(b.remaining()) { b.get(it).toDouble() } }
    OnnxJavaType.INT64 -> longBuffer.let { b -> DoubleArray(b.remaining()) { b.get(it).toDouble() } }
    OnnxJavaType.UINT8 -> byteBuffer.let { b -> DoubleArray(b.remaining()) { (b.get(it).toInt() and 0xff).toDouble() } }
    OnnxJavaType.INT8, OnnxJavaType.BOOL -> byteBuffer.let { b -> DoubleArray(b.remaining()) { b.get(it).toDouble() } }
    else -> error("output type ${info.type} is not supported by selfTest")
}

/** Cosine similarity as edgetune/accuracy.py computes it. */
private fun cosine(y: DoubleArray, r: DoubleArray): Double {
    if (!y.all { it.isFinite() } || !r.all { it.isFinite() })
        return if (y.indices.all { y[it] == r[it] || (y[it].isNaN() && r[it].isNaN()) }) 1.0 else 0.0
    val ny = sqrt(y.fold(0.0) { a, v -> a + v * v })
    val nr = sqrt(r.fold(0.0) { a, v -> a + v * v })
    if (ny == 0.0 && nr == 0.0) return 1.0
    if (ny == 0.0 || nr == 0.0) return 0.0
    return y.indices.fold(0.0) { a, i -> a + y[i] * r[i] } / (ny * nr)
}

private val SHA256_HEX = Regex("[0-9a-fA-F]{64}")

/** A file of the export that config.json names: relative, with no empty, "." or ".." part (safe_rel). */
private fun File.inside(rel: String?): File {
    check(rel != null && rel.split('/').none { it == "" || it == "." || it == ".." }) {
        "config.json names a file outside the artifact: '${rel ?: "(none)"}'"
    }
    return File(this, rel)
}

private val Match.lc get() = name.lowercase()

private fun sha256(input: InputStream): String {
    val md = MessageDigest.getInstance("SHA-256")
    val buf = ByteArray(1 shl 16)
    while (true) {
        val n = input.read(buf)
        if (n < 0) break
        md.update(buf, 0, n)
    }
    return md.digest().joinToString("") { "%02x".format(it) }
}

private fun JSONObject.str(k: String): String? = if (isNull(k)) null else get(k).toString()
private fun JSONObject.int(k: String): Int? = if (isNull(k)) null else getInt(k)
private fun JSONObject.strings(): Map<String, String> = keys().asSequence().associateWith { getString(it) }
private fun JSONArray?.objects(): List<JSONObject> = if (this == null) emptyList() else List(length()) { getJSONObject(it) }
