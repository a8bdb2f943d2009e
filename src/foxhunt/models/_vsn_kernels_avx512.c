/* _vsn_kernels.c for CPUs with AVX-512 (x86-64-v4): 16 floats a vector (setup.py). */
#define VL 16
#define MODULE _vsn_kernels_avx512
#include "_vsn_kernels.c"
