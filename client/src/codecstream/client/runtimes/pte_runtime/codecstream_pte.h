/* codecstream's ExecuTorch runtime: a .pte program behind a small C interface.
 *
 * What a phone app links (and what the Python client reaches through ctypes): ExecuTorch's C++
 * runtime with its XNNPACK delegate and CPU kernels, no torch. One program, one method
 * ("forward"), called one step at a time: the caller passes every input (the stateful decoder's
 * codes and state), the runtime computes, the caller reads every output (PCM and the next state)
 * before the next call.
 *
 * Errors: every function that can fail returns 0 on success and a non-zero status otherwise; the
 * reason, one line naming what was wrong, is then cs_pte_last_error()'s (per thread). No input,
 * file or call sequence makes these functions abort the process: a file that is not a valid
 * program is refused at cs_pte_open (header, then flatbuffer verification, then the method's
 * own checks), a wrong input at cs_pte_run.
 *
 * Not thread-safe per program: one call at a time on one program (its outputs live in the
 * program's planned memory, which the next run overwrites).
 */
#ifndef CODECSTREAM_PTE_H
#define CODECSTREAM_PTE_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define CS_PTE_API __declspec(dllexport)
#else
#define CS_PTE_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define CS_PTE_MAX_RANK 8

/* ExecuTorch's ScalarType codes for the dtypes a decoder program uses. */
#define CS_PTE_INT64 4
#define CS_PTE_FLOAT32 6
#define CS_PTE_BFLOAT16 15

typedef struct cs_pte_program cs_pte_program;

/* A tensor as the caller holds it: contiguous, row-major. */
typedef struct {
  int32_t dtype;
  int32_t rank;
  int64_t sizes[CS_PTE_MAX_RANK];
  void* data;
  size_t nbytes;
} cs_pte_tensor;

/* The reason of the last failure on this thread (empty when none). */
CS_PTE_API const char* cs_pte_last_error(void);

/* The ExecuTorch version this library was built against. */
CS_PTE_API const char* cs_pte_executorch_version(void);

/* Size the process-wide thread pool that XNNPACK and the CPU kernels share. threads >= 1. */
CS_PTE_API int cs_pte_set_threads(int32_t threads);
/* The thread pool's size now. */
CS_PTE_API int32_t cs_pte_threads(void);

/* Open `path` (memory-mapped) and load its "forward" method. */
CS_PTE_API int cs_pte_open(const char* path, cs_pte_program** program);
CS_PTE_API void cs_pte_close(cs_pte_program* program);

CS_PTE_API int32_t cs_pte_num_inputs(const cs_pte_program* program);
CS_PTE_API int32_t cs_pte_num_outputs(const cs_pte_program* program);
/* The dtype, rank and sizes of input or output `index` (`output` != 0); a dynamic dimension
 * reports its upper bound. `info->data` is NULL and `info->nbytes` the largest size. */
CS_PTE_API int cs_pte_describe(const cs_pte_program* program, int32_t output, int32_t index, cs_pte_tensor* info);

/* Run the method on `count` inputs (all of them, in order). Each is checked against the
 * method's dtype, rank and bounds before any is used. */
CS_PTE_API int cs_pte_run(cs_pte_program* program, const cs_pte_tensor* inputs, int32_t count);
/* Output `index` of the last run: dtype, rank, sizes, and `data` pointing into the program's
 * memory, valid until the next run or close. */
CS_PTE_API int cs_pte_output(const cs_pte_program* program, int32_t index, cs_pte_tensor* output);

/* The process's peak resident memory in bytes (VmHWM on Linux; 0 where unknown). */
CS_PTE_API int64_t cs_pte_peak_rss_bytes(void);

#ifdef __cplusplus
}
#endif

#endif
