/*
 * What every file of the emulator includes first: the CUDA headers (in CUDA 10 mode with the
 * two calls whose structs changed renamed out of the way, so that runtime.c and emu.c define
 * them in CUDA 10's layouts) and emu_internal.h.
 */
#ifndef VRAMLAB_EMU_CUDA_H
#define VRAMLAB_EMU_CUDA_H
#define _GNU_SOURCE
#ifdef VRAMLAB_CUDART_10 /* declared by the headers in CUDA 11's layout, defined below in 10's */
#define cudaGetDeviceProperties cudaGetDeviceProperties_cuda11
#define cudaPointerGetAttributes cudaPointerGetAttributes_cuda11
#endif
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "emu_internal.h"
#ifdef VRAMLAB_CUDART_10
#undef cudaPointerGetAttributes
#endif
#endif
