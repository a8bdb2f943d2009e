/* _vsn_kernels.c for CPUs with AVX2 and FMA (x86-64-v3): 8 floats a vector (setup.py). */
#define VL 8
#define MODULE _vsn_kernels_avx2
#include "_vsn_kernels.c"
