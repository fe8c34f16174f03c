/* The judge's artifact check: an ELF shared object of this machine, exporting the entry and nothing of the agent's. */
#include "judge_internal.h"

/* ------------------------------------------------------------------ ELF: the artifact's exports */

static const char* kLinkerNames[] = {"_init", "_fini", "_edata", "_end", "__bss_start", "__dso_handle",
                                     "_DYNAMIC", "_GLOBAL_OFFSET_TABLE_", "__gmon_start__"};

/* 0: fine; else the fault code set in s */
int jb_check_elf(judge_state* s, const char* path, char* err, size_t errlen) {
  FILE* f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "cannot read artifact: %s", strerror(errno));
    return -1;
  }
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  if (sz < (long)sizeof(Elf64_Ehdr) || sz > (1L << 30)) {
    fclose(f);
    jb_set_fault(s, "bad-artifact", "not an ELF shared object (%ld bytes)", sz);
    snprintf(err, errlen, "%s: %s", s->fault_code, s->fault_detail);
    return -1;
  }
  unsigned char* d = (unsigned char*)malloc((size_t)sz);
  if (!d || fread(d, 1, (size_t)sz, f) != (size_t)sz) {
    free(d);
    fclose(f);
    snprintf(err, errlen, "cannot read artifact");
    return -1;
  }
  fclose(f);
  size_t n = (size_t)sz;
  int rc = -1;
#define BAD(...)                                          \
  do {                                                    \
    jb_set_fault(s, "bad-artifact", __VA_ARGS__);            \
    goto out;                                             \
  } while (0)
  if (memcmp(d, ELFMAG, SELFMAG)) BAD("not an ELF file");
  if (d[EI_CLASS] != ELFCLASS64) {
    jb_set_fault(s, "wrong-architecture", "a 32-bit ELF file; this agent runs 64-bit kernels");
    goto out;
  }
  if (d[EI_DATA] != ELFDATA2LSB) BAD("not a little-endian ELF file");
  const Elf64_Ehdr* eh = (const Elf64_Ehdr*)d;
  if (eh->e_machine != ET_EM) {
    jb_set_fault(s, "wrong-architecture", "ELF e_machine %u, this agent runs e_machine %u", eh->e_machine, ET_EM);
    goto out;
  }
  if (eh->e_type != ET_DYN) BAD("not a shared object (ELF type %u)", eh->e_type);
  if (!eh->e_shoff || eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shnum == 0 || eh->e_shoff > n ||
      (size_t)eh->e_shnum > (n - eh->e_shoff) / sizeof(Elf64_Shdr))
    BAD("no usable section headers");
  const Elf64_Shdr* sh = (const Elf64_Shdr*)(d + eh->e_shoff);
  const Elf64_Shdr* dynsym = NULL;
  for (int i = 0; i < eh->e_shnum; i++)
    if (sh[i].sh_type == SHT_DYNSYM) dynsym = &sh[i];
  if (!dynsym) BAD("no dynamic symbol table");
  if (dynsym->sh_link >= eh->e_shnum) BAD("bad .dynsym link");
  const Elf64_Shdr* str = &sh[dynsym->sh_link];
  if (dynsym->sh_offset > n || dynsym->sh_size > n - dynsym->sh_offset || str->sh_offset > n ||
      str->sh_size > n - str->sh_offset || str->sh_size == 0)
    BAD("symbol table out of the file");
  const Elf64_Sym* syms = (const Elf64_Sym*)(d + dynsym->sh_offset);
  size_t nsyms = dynsym->sh_size / sizeof(Elf64_Sym);
  const char* strtab = (const char*)(d + str->sh_offset);
  size_t strsz = str->sh_size;
  int entry_found = 0;
  for (size_t i = 1; i < nsyms; i++) {
    const Elf64_Sym* y = &syms[i];
    int bind = ELF64_ST_BIND(y->st_info);
    if (y->st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE)) continue;
    if (y->st_name >= strsz || !memchr(strtab + y->st_name, 0, strsz - y->st_name)) BAD("symbol name out of bounds");
    const char* name = strtab + y->st_name;
    if (!*name) continue;
    if (!strcmp(name, s->entry)) {
      entry_found = 1;
      continue;
    }
    int skip = 0;
    for (size_t k = 0; k < sizeof kLinkerNames / sizeof *kLinkerNames; k++)
      if (!strcmp(name, kLinkerNames[k])) skip = 1;
    if (s->abi_tvm && (!strncmp(name, "__tvm", 5) || !strncmp(name, "__TVM", 5))) skip = 1;
    if (skip) continue;
    if (dlsym(RTLD_DEFAULT, name)) {
      jb_set_fault(s, "interposed-symbol", "the kernel defines '%s', a symbol of the agent's process", name);
      goto out;
    }
  }
  if (!entry_found) BAD("no exported symbol '%s'", s->entry);
  rc = 0;
out:
#undef BAD
  free(d);
  if (rc) snprintf(err, errlen, "%s: %s", s->fault_code, s->fault_detail);
  return rc;
}
