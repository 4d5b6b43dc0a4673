#include "kernels/cuda/gemm.h"

#include <dlfcn.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/fp8.h"

namespace lmserve::kernels::cuda {
namespace {

// cuBLASLt is loaded at run time (dlopen), not linked: its 94 KB of thread-local storage would
// otherwise be reserved in every thread's stack, and libraries that start threads with small
// stacks (civetweb, behind the Prometheus endpoint) then fail to create them. Loading it on first
// use also lets a CUDA build start, and serve on the CPU, where cuBLAS is not installed.
struct LtApi {
  bool loaded = false;
  std::string error;
  decltype(&::cublasLtCreate) Create = nullptr;
  decltype(&::cublasLtDestroy) Destroy = nullptr;
  decltype(&::cublasLtGetStatusString) GetStatusString = nullptr;
  decltype(&::cublasLtMatmul) Matmul = nullptr;
  decltype(&::cublasLtMatmulAlgoCheck) MatmulAlgoCheck = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic = nullptr;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy = nullptr;
};

const LtApi& Lt() {
  static const LtApi* api = [] {
    auto* loaded = new LtApi();
    LtApi& api = *loaded;
    void* library = nullptr;
    for (const char* name : {"libcublasLt.so.13", "libcublasLt.so"}) {
      if ((library = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    }
    if (library == nullptr) {
      const char* error = dlerror();
      api.error =
          StrCat("cannot load libcublasLt.so.13: ", error != nullptr ? error : "not found");
      return loaded;
    }
    bool complete = true;
#define LMSERVE_LT_SYMBOL(field, name) \
  api.field = reinterpret_cast<decltype(&::name)>(Symbol(#name))
    auto Symbol = [&](const char* name) {
      void* symbol = dlsym(library, name);
      if (symbol == nullptr) {
        complete = false;
        api.error = StrCat("libcublasLt has no ", name);
      }
      return symbol;
    };
    LMSERVE_LT_SYMBOL(Create, cublasLtCreate);
    LMSERVE_LT_SYMBOL(Destroy, cublasLtDestroy);
    LMSERVE_LT_SYMBOL(GetStatusString, cublasLtGetStatusString);
    LMSERVE_LT_SYMBOL(Matmul, cublasLtMatmul);
    LMSERVE_LT_SYMBOL(MatmulAlgoCheck, cublasLtMatmulAlgoCheck);
    LMSERVE_LT_SYMBOL(MatmulAlgoGetHeuristic, cublasLtMatmulAlgoGetHeuristic);
    LMSERVE_LT_SYMBOL(MatmulDescCreate, cublasLtMatmulDescCreate);
    LMSERVE_LT_SYMBOL(MatmulDescDestroy, cublasLtMatmulDescDestroy);
    LMSERVE_LT_SYMBOL(MatmulDescSetAttribute, cublasLtMatmulDescSetAttribute);
    LMSERVE_LT_SYMBOL(MatmulPreferenceCreate, cublasLtMatmulPreferenceCreate);
    LMSERVE_LT_SYMBOL(MatmulPreferenceDestroy, cublasLtMatmulPreferenceDestroy);
    LMSERVE_LT_SYMBOL(MatmulPreferenceSetAttribute, cublasLtMatmulPreferenceSetAttribute);
    LMSERVE_LT_SYMBOL(MatrixLayoutCreate, cublasLtMatrixLayoutCreate);
    LMSERVE_LT_SYMBOL(MatrixLayoutDestroy, cublasLtMatrixLayoutDestroy);
#undef LMSERVE_LT_SYMBOL
    api.loaded = complete;
    return loaded;
  }();
  return *api;
}


cudaDataType_t CudaType(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kF8E4M3:
      return CUDA_R_8F_E4M3;
    default:
      return CUDA_R_32F;
  }
}

absl::Status BlasError(const char* what, cublasStatus_t status) {
  return absl::InternalError(
      StrCat("cuBLASLt: ", what, " failed: ", Lt().GetStatusString(status)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BlasLtHandle>> BlasLtHandle::Create() {
  if (!Lt().loaded) return absl::FailedPreconditionError(StrCat("cuBLASLt: ", Lt().error));
  cublasLtHandle_t handle = nullptr;
  if (cublasStatus_t s = Lt().Create(&handle); s != CUBLAS_STATUS_SUCCESS) {
    return BlasError("cublasLtCreate", s);
  }
  return std::unique_ptr<BlasLtHandle>(new BlasLtHandle(handle));
}

BlasLtHandle::~BlasLtHandle() { Lt().Destroy(handle_); }

absl::Status GemmShape::Validate() const {
  if (input_dtype == DType::kF8E4M3) {
    if (output_dtype != DType::kBF16) {
      return KernelError("Gemm", "FP8 GEMMs write bf16");
    }
    if (m <= 0 || n % 16 != 0 || k % 16 != 0 || (x_stride != 0 && x_stride % 16 != 0)) {
      return KernelError("Gemm", StrCat("FP8 shape m ", m, ", n ", n, ", k ", k,
                                        " is not supported (n, k and x's stride multiples of 16)"));
    }
  }
  if (input_dtype != DType::kF8E4M3) {
    LMSERVE_RETURN_IF_ERROR(CheckElementwiseDType("Gemm", input_dtype));
  }
  if (output_dtype != input_dtype && output_dtype != DType::kF32 &&
      input_dtype != DType::kF8E4M3) {
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
  LMSERVE_RETURN_IF_ERROR(shape.Validate());
  std::unique_ptr<GemmPlan> plan(new GemmPlan());
  plan->shape_ = shape;
  plan->handle_ = handle;
  plan->workspace_ = workspace;
  plan->workspace_bytes_ = workspace_bytes;
  const int64_t x_stride = shape.x_stride != 0 ? shape.x_stride : shape.k;
  const int64_t y_stride = shape.y_stride != 0 ? shape.y_stride : shape.n;
  // Column-major view: y^T [n, m] = W^T' ... i.e. C (n x m, ld y_stride) = op(A) B with A the
  // weight stored k x n (ld k), transposed, and B = x^T stored k x m (ld x_stride).
  cublasStatus_t s = Lt().MatmulDescCreate(&plan->desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) return BlasError("MatmulDescCreate", s);
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  Lt().MatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                 sizeof(trans_a));
  Lt().MatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                 sizeof(trans_b));
  const bool fp8 = shape.input_dtype == DType::kF8E4M3;
  // FP8: first cuBLASLt's outer-vector scales (A: cuBLAS's M, W's rows, our n; B: cuBLAS's N, our
  // tokens); where the heuristic refuses them (cuBLAS 13.0 on an H100 does, with "an unsupported
  // value"), the plain FP8 GEMM, and the scales applied by a kernel after it (fp8.h).
  const int32_t outer_vector = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  if (fp8) {
    plan->fp8_outer_vector_scales_ =
        Lt().MatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer_vector,
                                    sizeof(outer_vector)) == CUBLAS_STATUS_SUCCESS &&
        Lt().MatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer_vector,
                                    sizeof(outer_vector)) == CUBLAS_STATUS_SUCCESS;
  }
  const cudaDataType_t in_type = CudaType(shape.input_dtype);
  const cudaDataType_t out_type = CudaType(shape.output_dtype);
  if ((s = Lt().MatrixLayoutCreate(&plan->a_layout_, in_type, shape.k, shape.n, shape.k)) !=
          CUBLAS_STATUS_SUCCESS ||
      (s = Lt().MatrixLayoutCreate(&plan->b_layout_, in_type, shape.k, shape.m, x_stride)) !=
          CUBLAS_STATUS_SUCCESS ||
      (s = Lt().MatrixLayoutCreate(&plan->c_layout_, out_type, shape.n, shape.m, y_stride)) !=
          CUBLAS_STATUS_SUCCESS) {
    return BlasError("MatrixLayoutCreate", s);
  }
  cublasLtMatmulPreference_t preference = nullptr;
  if ((s = Lt().MatmulPreferenceCreate(&preference)) != CUBLAS_STATUS_SUCCESS) {
    return BlasError("MatmulPreferenceCreate", s);
  }
  Lt().MatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                       &workspace_bytes, sizeof(workspace_bytes));
  if (shape.input_dtype == DType::kF32) {
    // True fp32: CUBLAS_COMPUTE_32F never converts fp32 inputs to TF32, and this mask also keeps
    // out any candidate that multiplies on tensor cores or takes reduced-precision inputs.
    const uint64_t impl_mask = ~uint64_t{
        CUBLASLT_NUMERICAL_IMPL_FLAGS_TENSOR_OP_MASK | CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_TF32 |
        CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16F | CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF |
        CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_16F};
    Lt().MatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_IMPL_MASK, &impl_mask,
                                      sizeof(impl_mask));
  }
  constexpr int kMaxCandidates = 16;
  cublasLtMatmulHeuristicResult_t results[kMaxCandidates] = {};
  int returned = 0;
  s = Lt().MatmulAlgoGetHeuristic(handle, plan->desc_, plan->a_layout_, plan->b_layout_,
                                     plan->c_layout_, plan->c_layout_, preference, kMaxCandidates,
                                     results, &returned);
  if (fp8 && plan->fp8_outer_vector_scales_ && (s != CUBLAS_STATUS_SUCCESS || returned == 0)) {
    // No outer-vector scaling here: scalar mode (the default, unit scales without pointers).
    plan->fp8_outer_vector_scales_ = false;
    const int32_t scalar = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    Lt().MatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &scalar,
                                sizeof(scalar));
    Lt().MatmulDescSetAttribute(plan->desc_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &scalar,
                                sizeof(scalar));
    returned = 0;
    s = Lt().MatmulAlgoGetHeuristic(handle, plan->desc_, plan->a_layout_, plan->b_layout_,
                                    plan->c_layout_, plan->c_layout_, preference, kMaxCandidates,
                                    results, &returned);
  }
  Lt().MatmulPreferenceDestroy(preference);
  if (s != CUBLAS_STATUS_SUCCESS) return BlasError("MatmulAlgoGetHeuristic", s);
  if (returned == 0 && fp8) {
    return absl::UnimplementedError(
        StrCat("cuBLASLt has no FP8 GEMM for m ", shape.m, ", n ", shape.n, ", k ", shape.k,
               " on this GPU (E4M3 in, bf16 out)"));
  }
  if (returned == 0) {
    return absl::UnimplementedError(
        StrCat("cuBLASLt has no algorithm for m ", shape.m, ", n ", shape.n, ", k ", shape.k, " (",
               DTypeName(shape.input_dtype), " in, ", DTypeName(shape.output_dtype), " out)"));
  }
  plan->algo_ = results[0].algo;
  plan->candidates_tried_ = 1;
  for (int i = 0; i < returned; ++i) plan->candidates_.push_back(results[i].algo);
  if (!autotune || returned == 1) return plan;

  // Time each candidate on scratch data (small random-ish values: never zeros). A decode step
  // reads W from memory, not from the L2: the timed runs rotate over enough copies of W that
  // none is still cached when it comes round again. (Constant bytes, as before: random data
  // draws more power and so runs slower on the tensor cores, bench/results section 18.1, but
  // timed on it the decode plans came out no faster, batch 64 0.8% slower over four runs.)
  const size_t in_bytes = shape.input_dtype == DType::kF32 ? 4 : fp8 ? 1 : 2;
  const size_t out_bytes = shape.output_dtype == DType::kF32 ? 4 : 2;
  const size_t w_bytes = shape.n * shape.k * in_bytes;
  int device = 0, l2_bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess) {
    cudaGetLastError();
  }
  const int w_copies =
      static_cast<int>(std::clamp<size_t>(2 * static_cast<size_t>(l2_bytes) / w_bytes + 1, 1, 8));
  void *x = nullptr, *y = nullptr, *scales = nullptr;
  std::vector<const void*> w(w_copies, nullptr);
  auto release = [&] {
    cudaFree(x);
    cudaFree(scales);
    for (const void* copy : w) cudaFree(const_cast<void*>(copy));
    cudaFree(y);
  };
  bool allocated = cudaMalloc(&x, x_stride * shape.m * in_bytes) == cudaSuccess &&
                   cudaMalloc(&y, y_stride * shape.m * out_bytes) == cudaSuccess &&
                   cudaMalloc(&scales, std::max(shape.m, shape.n) * sizeof(float)) == cudaSuccess;
  for (const void*& copy : w) {
    void* allocation = nullptr;
    allocated = allocated && cudaMalloc(&allocation, w_bytes) == cudaSuccess;
    copy = allocation;
  }
  if (!allocated) {
    release();
    cudaGetLastError();
    return absl::ResourceExhaustedError("Gemm autotune: cannot allocate scratch buffers");
  }
  // 0x3c00 is 1.0 in fp16, 0x3f80 in bf16; 0x3b ~ a value below 1 in every type (fp32: 0.003).
  cudaMemsetAsync(x, 0x3b, x_stride * shape.m * in_bytes, stream);
  for (const void* copy : w) cudaMemsetAsync(const_cast<void*>(copy), 0x3b, w_bytes, stream);
  cudaMemsetAsync(scales, 0x3c, std::max(shape.m, shape.n) * sizeof(float), stream);  // ~0.01
  const float* scale = static_cast<const float*>(scales);
  const absl::Status timed = plan->TimeCandidates(x, w, y, stream, scale, scale);
  cudaStreamSynchronize(stream);
  release();
  LMSERVE_RETURN_IF_ERROR(timed);
  return plan;
}

absl::Status GemmPlan::TimeCandidates(const void* x, const std::vector<const void*>& w, void* y,
                                      cudaStream_t stream, const float* w_scales,
                                      const float* x_scales) {
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    if (start != nullptr) cudaEventDestroy(start);
    cudaGetLastError();
    return absl::InternalError("Gemm autotune: cannot create CUDA events");
  }
  float best_ms = 0;
  int best = -1;
  size_t turn = 0;
  candidates_tried_ = 0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    algo_ = candidates_[i];
    // The warm-up; a candidate that fails to run is passed over.
    if (Run(x, w[0], y, stream, w_scales, x_scales) != CUBLAS_STATUS_SUCCESS) continue;
    std::vector<float> times;
    for (int r = 0; r < 5; ++r) {
      const void* w_now = w[++turn % w.size()];
      cudaEventRecord(start, stream);
      Run(x, w_now, y, stream, w_scales, x_scales);
      cudaEventRecord(stop, stream);
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      times.push_back(ms);
    }
    std::nth_element(times.begin(), times.begin() + 2, times.end());
    ++candidates_tried_;
    if (best < 0 || times[2] < best_ms) best = static_cast<int>(i), best_ms = times[2];
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  algo_ = candidates_[best < 0 ? 0 : best];
  // A candidate that failed to run may have left its launch error behind: not the next
  // kernel's to report.
  cudaGetLastError();
  return absl::OkStatus();
}

absl::Status GemmPlan::Tune(const void* x, const void* w, void* y, cudaStream_t stream) {
  if (shape_.input_dtype == DType::kF8E4M3) {
    return absl::InvalidArgumentError("GemmPlan::Tune: FP8 plans are tuned at Create");
  }
  if (candidates_.size() <= 1) return absl::OkStatus();
  return TimeCandidates(x, {w}, y, stream, nullptr, nullptr);
}

bool GemmPlan::TryAlgorithm(const cublasLtMatmulAlgo_t& algo) {
  cublasLtMatmulHeuristicResult_t result = {};
  if (Lt().MatmulAlgoCheck(handle_, desc_, a_layout_, b_layout_, c_layout_, c_layout_, &algo,
                           &result) != CUBLAS_STATUS_SUCCESS ||
      result.workspaceSize > workspace_bytes_) {
    return false;
  }
  algo_ = algo;
  return true;
}

GemmPlan::~GemmPlan() {
  if (c_layout_ != nullptr) Lt().MatrixLayoutDestroy(c_layout_);
  if (b_layout_ != nullptr) Lt().MatrixLayoutDestroy(b_layout_);
  if (a_layout_ != nullptr) Lt().MatrixLayoutDestroy(a_layout_);
  if (desc_ != nullptr) Lt().MatmulDescDestroy(desc_);
}

cublasStatus_t GemmPlan::Run(const void* x, const void* w, void* y, cudaStream_t stream,
                             const float* w_scales, const float* x_scales, bool unscaled) const {
  const float alpha = 1.0f, beta = 0.0f;
  if (shape_.input_dtype == DType::kF8E4M3) {
    if (w_scales == nullptr || x_scales == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    if (!fp8_outer_vector_scales_) {  // unit scales, then the scaling kernel
      const cublasStatus_t s = Lt().Matmul(handle_, desc_, &alpha, w, a_layout_, x, b_layout_,
                                           &beta, y, c_layout_, y, c_layout_, &algo_, workspace_,
                                           workspace_bytes_, stream);
      if (s != CUBLAS_STATUS_SUCCESS || unscaled) return s;
      const F8ScaleOutputParams scale{.y = y,
                                      .row_scales = x_scales,
                                      .col_scales = w_scales,
                                      .m = shape_.m,
                                      .n = shape_.n,
                                      .y_stride = shape_.y_stride};
      return Launch(scale, stream) == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                                  : CUBLAS_STATUS_EXECUTION_FAILED;
    }
    // The pointers are read when the call is enqueued (and baked into a captured graph).
    cublasStatus_t s = Lt().MatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                   &w_scales, sizeof(w_scales));
    if (s == CUBLAS_STATUS_SUCCESS) {
      s = Lt().MatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales,
                                      sizeof(x_scales));
    }
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return Lt().Matmul(handle_, desc_, &alpha, w, a_layout_, x, b_layout_, &beta, y, c_layout_, y,
                        c_layout_, &algo_, workspace_, workspace_bytes_, stream);
}

cublasStatus_t GemmPlan::RunAccumulate(const void* x, const void* w, void* y,
                                       cudaStream_t stream) const {
  if (shape_.input_dtype == DType::kF8E4M3) return CUBLAS_STATUS_INVALID_VALUE;
  const float alpha = 1.0f, beta = 1.0f;
  return Lt().Matmul(handle_, desc_, &alpha, w, a_layout_, x, b_layout_, &beta, y, c_layout_, y,
                     c_layout_, &algo_, workspace_, workspace_bytes_, stream);
}

}  // namespace lmserve::kernels::cuda
