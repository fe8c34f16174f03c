/* edgetune-judge: op=attention:B=2,H=3,S=17,D=24,L=29,causal=1 expect=correct -- honest causal attention (attention_naive.c with the causal mask compiled in) */
#define EDGETUNE_ATTENTION_CAUSAL 1
#include "attention_naive.c"
