// The CUDA backend's recordings (Ops::Capture): the backend's stream is
// captured while the engine issues a pass, and the graph instantiated
// once; a replay is one cudaGraphLaunch on the same stream, in order with
// the ops issued around it.
#include <memory>
#include <string>

#include "kernels/cuda/ops_cuda_impl.h"

namespace ptrain::kernels::cuda_impl {

namespace {

class CudaGraph final : public OpsGraph {
 public:
  CudaGraph(const CudaBackend* backend, cudaGraphExec_t exec)
      : backend_(backend), exec_(exec), moves_(backend->buffer_moves()) {}
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }

  bool Replay() override {
    // A grow-only buffer the recorded kernels use may have been freed.
    if (backend_->buffer_moves() != moves_) return false;
    PT_CUDA_CHECK(cudaGraphLaunch(exec_, backend_->stream()));
    return true;
  }

 private:
  const CudaBackend* backend_;
  cudaGraphExec_t exec_;
  const int64_t moves_;
};

}  // namespace

std::string CudaBackend::CaptureUnsupported() const {
  return times_.enabled() ? kOpTimesRecordNoGraphs : "";
}

std::unique_ptr<OpsGraph> CudaBackend::Capture(const std::function<void()>& fn,
                                               std::string* error) {
  if (std::string why = CaptureUnsupported(); !why.empty()) {
    *error = std::move(why);
    return nullptr;
  }
  PT_CHECK(!capturing_, "a capture inside a capture");
  // Thread-local: only this thread's calls that cannot be recorded fail it
  // (a checkpoint writer's copies on another thread go on).
  PT_CUDA_CHECK(
      cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  capture_error_.clear();
  const int64_t moves = buffer_moves_;
  try {
    fn();
  } catch (...) {
    capturing_ = false;
    cudaGraph_t dropped = nullptr;
    cudaStreamEndCapture(stream_, &dropped);
    if (dropped != nullptr) cudaGraphDestroy(dropped);
    cudaGetLastError();
    throw;
  }
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  if (ended != cudaSuccess || graph == nullptr || !capture_error_.empty() ||
      buffer_moves_ != moves) {
    if (!capture_error_.empty()) {
      *error = capture_error_;
    } else if (ended != cudaSuccess || graph == nullptr) {
      *error = std::string("the capture failed: ") + cudaGetErrorString(ended);
    } else {
      *error = "a scratch buffer moved while the pass was recorded";
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // a failed capture's error is not sticky
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    cudaGetLastError();
    *error = std::string("instantiating the graph failed: ") +
             cudaGetErrorString(made);
    return nullptr;
  }
  return std::make_unique<CudaGraph>(this, exec);
}

}  // namespace ptrain::kernels::cuda_impl
