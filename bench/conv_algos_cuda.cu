// Where the convolutional surrogate's time goes on the GPU: for each of its convolutions (64 x 64
// images, 3 x 3, padding 1: 2 -> 16, 16 -> 16 and 16 -> 2 channels) at batches 1, 16 and 256,
//   - remat's own call (kernels::conv2d_forward: the algorithm cuDNN's v7 heuristic ranks first,
//     FMA math, NCHW), without and with the bias (cudnnAddTensor), timed with CUDA events;
//   - every forward algorithm cuDNN has, timed by cuDNN itself (cudnnFindConvolutionForwardAlgorithmEx)
//     in NCHW and NHWC, with FMA math (fp32 as remat computes it) and cuDNN's default math;
//   - the backward algorithms (data and filter), NCHW, FMA math.
// Each line says the algorithm, its time, its workspace and whether cuDNN calls it deterministic.
// A diagnostic for the GPU scripts (.gpu/run.sh conv), not a benchmark against a peer: PyTorch's
// side of the same question is bench/inference_torch_cuda.py --profile.
//
//   conv_algos_cuda [--batches 1,16,256]
#include <remat/remat.hpp>

#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace remat;

namespace {

#define CK(call)                                                                                  \
  do {                                                                                            \
    cudnnStatus_t s_ = (call);                                                                    \
    if (s_ != CUDNN_STATUS_SUCCESS) {                                                             \
      std::printf("  %s: %s\n", #call, cudnnGetErrorString(s_));                                  \
      return;                                                                                     \
    }                                                                                             \
  } while (0)

char const* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH:
      return "default";
    case CUDNN_TENSOR_OP_MATH:
      return "tensor-op";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
      return "tensor-op-conv";
    case CUDNN_FMA_MATH:
      return "fma";
  }
  return "?";
}

// Microseconds per call of f, median of 5 rounds of 20 calls after 5 untimed.
template <class F>
double time_us(F&& f) {
  for (int i = 0; i < 5; ++i) f();
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  std::vector<double> per;
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(a);
    for (int i = 0; i < 20; ++i) f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    per.push_back(double(ms) * 1e3 / 20);
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  std::sort(per.begin(), per.end());
  return per[2];
}

struct buffers {
  float *x, *w, *b, *y, *ws;
  std::size_t ws_bytes = std::size_t(512) << 20;
};

template <class Perf>
void print_perf(char const* what, Perf const* perf, int got) {
  for (int i = 0; i < got; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    std::printf("    %-16s algo %d: %9.1f us, workspace %8.2f MiB, %s, math %s\n", what, int(perf[i].algo),
                double(perf[i].time) * 1e3, double(perf[i].memory) / (1 << 20),
                perf[i].determinism == CUDNN_DETERMINISTIC ? "deterministic" : "NOT deterministic",
                math_name(perf[i].mathType));
  }
}

void find_all(cudnnHandle_t h, kernels::conv_shape const& c, buffers const& m, cudnnTensorFormat_t format,
              cudnnMathType_t math, bool backward) {
  cudnnTensorDescriptor_t xd, yd;
  cudnnFilterDescriptor_t wd;
  cudnnConvolutionDescriptor_t cd;
  CK(cudnnCreateTensorDescriptor(&xd));
  CK(cudnnCreateTensorDescriptor(&yd));
  CK(cudnnCreateFilterDescriptor(&wd));
  CK(cudnnCreateConvolutionDescriptor(&cd));
  int const n = int(c.batch), ci = int(c.in_channels), co = int(c.out_channels), hh = int(c.height),
            ww = int(c.width), k = int(c.kernel);
  CK(cudnnSetTensor4dDescriptor(xd, format, CUDNN_DATA_FLOAT, n, ci, hh, ww));
  CK(cudnnSetTensor4dDescriptor(yd, format, CUDNN_DATA_FLOAT, n, co, hh, ww));
  CK(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, format, co, ci, k, k));
  CK(cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  CK(cudnnSetConvolutionMathType(cd, math));
  std::printf("  %s, math %s\n", format == CUDNN_TENSOR_NCHW ? "NCHW" : "NHWC", math_name(math));
  constexpr int ask = 16;
  int got = 0;
  cudnnConvolutionFwdAlgoPerf_t f[ask];
  CK(cudnnFindConvolutionForwardAlgorithmEx(h, xd, m.x, wd, m.w, cd, yd, m.y, ask, &got, f, m.ws, m.ws_bytes));
  print_perf("forward", f, got);
  if (backward) {
    cudnnConvolutionBwdDataAlgoPerf_t d[ask];
    CK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, wd, m.w, yd, m.y, cd, xd, m.x, ask, &got, d, m.ws,
                                                    m.ws_bytes));
    print_perf("backward data", d, got);
    cudnnConvolutionBwdFilterAlgoPerf_t g[ask];
    CK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, xd, m.x, yd, m.y, cd, wd, m.w, ask, &got, g, m.ws,
                                                      m.ws_bytes));
    print_perf("backward filter", g, got);
  }
  cudnnDestroyTensorDescriptor(xd), cudnnDestroyTensorDescriptor(yd), cudnnDestroyFilterDescriptor(wd),
      cudnnDestroyConvolutionDescriptor(cd);
}

void probe(std::size_t batch, std::size_t in, std::size_t out, bool backward) {
  kernels::conv_shape const c{batch, in, 64, 64, out, 3, 1, 1};
  buffers m{};
  cudaMalloc(&m.x, c.batch * c.in_features() * sizeof(float));
  cudaMalloc(&m.y, c.batch * c.out_features() * sizeof(float));
  cudaMalloc(&m.w, c.weight_count() * sizeof(float));
  cudaMalloc(&m.b, c.out_channels * sizeof(float));
  cudaMalloc(&m.ws, m.ws_bytes);
  std::vector<float> hx(c.batch * c.in_features()), hw(c.weight_count()), hb(c.out_channels);
  for (std::size_t i = 0; i < hx.size(); ++i) hx[i] = float(std::sin(0.01 * double(i)));
  for (std::size_t i = 0; i < hw.size(); ++i) hw[i] = float(std::cos(0.3 * double(i))) * 0.1f;
  for (std::size_t i = 0; i < hb.size(); ++i) hb[i] = 0.01f * float(i);
  cudaMemcpy(m.x, hx.data(), hx.size() * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(m.w, hw.data(), hw.size() * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(m.b, hb.data(), hb.size() * sizeof(float), cudaMemcpyHostToDevice);
  auto const& p = kernels::detail::cudnn_conv_for(c);
  double const bare = time_us([&] { kernels::conv2d_forward(remat::cuda{}, c, m.x, m.w, nullptr, m.y); });
  double const biased = time_us([&] { kernels::conv2d_forward(remat::cuda{}, c, m.x, m.w, m.b, m.y); });
  std::printf("batch %zu, %zu -> %zu channels: remat's call (forward algo %d, data %d, filter %d) %.1f us, "
              "with the bias %.1f us\n",
              batch, in, out, int(p.forward), int(p.backward_data), int(p.backward_filter), bare, biased);
  std::printf("json: {\"probe\": \"conv\", \"batch\": %zu, \"in\": %zu, \"out\": %zu, \"remat_us\": %.2f, "
              "\"remat_bias_us\": %.2f, \"algo\": %d}\n",
              batch, in, out, bare, biased, int(p.forward));
  cudnnHandle_t const h = kernels::detail::cudnn_handle::on_current_stream();
  for (auto format : {CUDNN_TENSOR_NCHW, CUDNN_TENSOR_NHWC})
    for (auto math : {CUDNN_FMA_MATH, CUDNN_DEFAULT_MATH})
      find_all(h, c, m, format, math, backward && format == CUDNN_TENSOR_NCHW && math == CUDNN_FMA_MATH);
  cudaDeviceSynchronize();
  cudaFree(m.x), cudaFree(m.y), cudaFree(m.w), cudaFree(m.b), cudaFree(m.ws);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::size_t> batches{1, 16, 256};
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--batches")) {
      batches.clear();
      for (char const* q = argv[i + 1]; *q;) {
        batches.push_back(std::strtoul(q, const_cast<char**>(&q), 10));
        if (*q == ',') ++q;
      }
    }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("cuDNN %zu on %s\n", cudnnGetVersion(), prop.name);
  for (std::size_t b : batches) {
    probe(b, 2, 16, false);
    probe(b, 16, 16, true);
    probe(b, 16, 2, false);
  }
  return 0;
}
