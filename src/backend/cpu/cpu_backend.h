// The CPU backend: reference implementation of every op (OpenMP over rows, OpenBLAS for GEMM).
#pragma once

#include <memory>

#include "backend/backend.h"

namespace moeserve {

[[nodiscard]] std::unique_ptr<Backend> make_cpu_backend();

namespace cpu {
// Naive triple-loop GEMM (double accumulation): the oracle the OpenBLAS path is tested against.
void gemm_reference(const GemmParams& p);
// OpenBLAS sgemm.
void gemm_blas(const GemmParams& p);
}  // namespace cpu

}  // namespace moeserve
