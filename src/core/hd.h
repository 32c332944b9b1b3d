/*
 * hd.h — IB_HD marks a small inline function of a header as callable from host code and from CUDA
 * device code alike, so the CUDA backend computes with the very same definition (fmath.h's ib_expf_lane,
 * half.h's conversions). In a plain C build it expands to nothing; host bits never change.
 */
#ifndef IB_CORE_HD_H
#define IB_CORE_HD_H
#if defined(__CUDACC__)
#define IB_HD __host__ __device__
#else
#define IB_HD
#endif
#endif
