#include "kernels/cuda/gemm.h"

#include <algorithm>
#include <vector>

#include "common/strings.h"
#include "kernels/cuda/check.h"

namespace lmserve::kernels::cuda {
namespace {

cudaDataType_t CudaType(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

absl::Status BlasError(const char* what, cublasStatus_t status) {
  return absl::InternalError(
      StrCat("cuBLASLt: ", what, " failed: ", cublasLtGetStatusString(status)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BlasLtHandle>> BlasLtHandle::Create() {
  cublasLtHandle_t handle = nullptr;
  if (cublasStatus_t s = cublasLtCreate(&handle); s != CUBLAS_STATUS_SUCCESS) {
    return BlasError("cublasLtCreate", s);
  }
  return std::unique_ptr<BlasLtHandle>(new BlasLtHandle(handle));
}

BlasLtHandle::~BlasLtHandle() { cublasLtDestroy(handle_); }

absl::Status GemmShape::Validate() const {
  if (absl::Status s = CheckActivationDType("Gemm", input_dtype); !s.ok()) return s;
  if (output_dtype != input_dtype && output_dtype != DType::kF32) {
    return KernelError("Gemm", StrCat("output dtype ", DTypeName(output_dtype),
                                      " is not supported (the input type or f32)"));
  }
  if (m <= 0 || n <= 0 || k <= 0 || n % 8 != 0 || k % 8 != 0) {
    return KernelError("Gemm", StrCat("shape m ", m, ", n ", n, ", k ", k,
                                      " is not supported (positive; n and k multiples of 8)"));
  }
  if ((x_stride != 0 && (x_stride < k || x_stride % 8 != 0)) ||
      (y_stride != 0 && (y_stride < n || y_stride % 8 != 0))) {
    return KernelError("Gemm", "strides must be multiples of 8 and at least a row");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GemmPlan>> GemmPlan::Create(cublasLtHandle_t handle,
                                                           const GemmShape& shape, void* workspace,
                                                           size_t workspace_bytes, bool autotune,
                                                           cudaStream_t stream) {
  if (absl::Status s = shape.Validate(); !s.ok()) return s;
  std::unique_ptr<GemmPlan> plan(new GemmPlan());
  plan->shape_ = shape;
  plan->handle_ = handle;
  plan->workspace_ = workspace;
  plan->workspace_bytes_ = workspace_bytes;
  const int64_t x_stride = shape.x_stride != 0 ? shape.x_stride : shape.k;
  const int64_t y_stride = shape.y_stride != 0 ? shape.y_stride : shape.n;
  // Column-major view: y^T [n, m] = W^T' ... i.e. C (n x m, ld y_stride) = op(A) B with A the
  // weight stored k x n (ld k), transposed, and B = x^T stored k x m (ld x_stride).
  cublasStatus_t s = cublasLtMatmulDescCreate(&plan->desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) return BlasError("MatmulDescCreate", s);
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                 sizeof(trans_a));
  cublasLtMatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                 sizeof(trans_b));
  const cudaDataType_t in_type = CudaType(shape.input_dtype);
  const cudaDataType_t out_type = CudaType(shape.output_dtype);
  if ((s = cublasLtMatrixLayoutCreate(&plan->a_layout_, in_type, shape.k, shape.n, shape.k)) !=
          CUBLAS_STATUS_SUCCESS ||
      (s = cublasLtMatrixLayoutCreate(&plan->b_layout_, in_type, shape.k, shape.m, x_stride)) !=
          CUBLAS_STATUS_SUCCESS ||
      (s = cublasLtMatrixLayoutCreate(&plan->c_layout_, out_type, shape.n, shape.m, y_stride)) !=
          CUBLAS_STATUS_SUCCESS) {
    return BlasError("MatrixLayoutCreate", s);
  }
  cublasLtMatmulPreference_t preference = nullptr;
  if ((s = cublasLtMatmulPreferenceCreate(&preference)) != CUBLAS_STATUS_SUCCESS) {
    return BlasError("MatmulPreferenceCreate", s);
  }
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                       &workspace_bytes, sizeof(workspace_bytes));
  constexpr int kMaxCandidates = 16;
  cublasLtMatmulHeuristicResult_t results[kMaxCandidates] = {};
  int returned = 0;
  s = cublasLtMatmulAlgoGetHeuristic(handle, plan->desc_, plan->a_layout_, plan->b_layout_,
                                     plan->c_layout_, plan->c_layout_, preference, kMaxCandidates,
                                     results, &returned);
  cublasLtMatmulPreferenceDestroy(preference);
  if (s != CUBLAS_STATUS_SUCCESS) return BlasError("MatmulAlgoGetHeuristic", s);
  if (returned == 0) {
    return absl::UnimplementedError(StrCat("cuBLASLt has no algorithm for m ", shape.m, ", n ",
                                           shape.n, ", k ", shape.k));
  }
  plan->algo_ = results[0].algo;
  plan->candidates_tried_ = 1;
  if (!autotune || returned == 1) return plan;

  // Time each candidate on scratch data (small random-ish values: never zeros).
  const size_t in_bytes = 2, out_bytes = shape.output_dtype == DType::kF32 ? 4 : 2;
  void *x = nullptr, *w = nullptr, *y = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  auto release = [&] {
    cudaFree(x);
    cudaFree(w);
    cudaFree(y);
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
  };
  if (cudaMalloc(&x, x_stride * shape.m * in_bytes) != cudaSuccess ||
      cudaMalloc(&w, shape.n * shape.k * in_bytes) != cudaSuccess ||
      cudaMalloc(&y, y_stride * shape.m * out_bytes) != cudaSuccess ||
      cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    release();
    return absl::ResourceExhaustedError("Gemm autotune: cannot allocate scratch buffers");
  }
  // 0x3c00 is 1.0 in fp16, 0x3f80 in bf16; 0x3b ~ a value below 1 either way.
  cudaMemsetAsync(x, 0x3b, x_stride * shape.m * in_bytes, stream);
  cudaMemsetAsync(w, 0x3b, shape.n * shape.k * in_bytes, stream);
  float best_ms = 0;
  int best = -1;
  for (int i = 0; i < returned; ++i) {
    plan->algo_ = results[i].algo;
    if (plan->Run(x, w, y, stream) != CUBLAS_STATUS_SUCCESS) continue;  // warm-up
    std::vector<float> times;
    for (int r = 0; r < 5; ++r) {
      cudaEventRecord(start, stream);
      plan->Run(x, w, y, stream);
      cudaEventRecord(stop, stream);
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      times.push_back(ms);
    }
    std::nth_element(times.begin(), times.begin() + 2, times.end());
    ++plan->candidates_tried_;
    if (best < 0 || times[2] < best_ms) best = i, best_ms = times[2];
  }
  cudaStreamSynchronize(stream);
  release();
  plan->algo_ = results[best < 0 ? 0 : best].algo;
  return plan;
}

GemmPlan::~GemmPlan() {
  if (c_layout_ != nullptr) cublasLtMatrixLayoutDestroy(c_layout_);
  if (b_layout_ != nullptr) cublasLtMatrixLayoutDestroy(b_layout_);
  if (a_layout_ != nullptr) cublasLtMatrixLayoutDestroy(a_layout_);
  if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
}

cublasStatus_t GemmPlan::Run(const void* x, const void* w, void* y, cudaStream_t stream) const {
  const float alpha = 1.0f, beta = 0.0f;
  return cublasLtMatmul(handle_, desc_, &alpha, w, a_layout_, x, b_layout_, &beta, y, c_layout_, y,
                        c_layout_, &algo_, workspace_, workspace_bytes_, stream);
}

}  // namespace lmserve::kernels::cuda
