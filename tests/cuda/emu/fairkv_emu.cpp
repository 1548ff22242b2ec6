// fairkv's CUDA emulator: the runtime (memory, streams, graphs) and the grid scheduler (fairkv_emu.hpp says what it
// is and is not). A launch runs to completion before submit() returns: workers take the grid's blocks in order
// from a shared counter, and each runs its block's threads as fibers.
#include "fairkv_emu.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

// The fibers' entry point (global, C linkage: the x86-64 trampoline calls it by name).
extern "C" [[noreturn]] void fairkv_emu_fiber_main(void* arg);
#if defined(__x86_64__)
// Saves the callee-saved registers on the current stack, stores the stack pointer in *from, and resumes the
// context saved at `to` (SysV x86-64: rbx, rbp, r12-r15 are callee-saved; the kernels never change MXCSR).
extern "C" void fairkv_emu_switch(void** from, void* to);
extern "C" void fairkv_emu_trampoline();
asm(R"(
  .text
  .globl fairkv_emu_switch
  .type fairkv_emu_switch, @function
fairkv_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size fairkv_emu_switch, .-fairkv_emu_switch
  .globl fairkv_emu_trampoline
  .type fairkv_emu_trampoline, @function
fairkv_emu_trampoline:
  movq %r12, %rdi
  call fairkv_emu_fiber_main@PLT
  ud2
  .size fairkv_emu_trampoline, .-fairkv_emu_trampoline
)");
#endif

namespace fairkv_emu {
namespace detail {

thread_local const thread_coords* current = nullptr;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fairkv CUDA emulator: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

namespace {

// ---- fiber switching ----------------------------------------------------------------------------------------------
#if defined(__x86_64__)
struct context {
  void* sp = nullptr;
};
inline void switch_context(context& from, context& to) { fairkv_emu_switch(&from.sp, to.sp); }
// A fresh context on [stack, stack + size) that starts in fairkv_emu_fiber_main(arg).
inline void make_context(context& c, char* stack, std::size_t size, void* arg) {
  const auto top = (reinterpret_cast<std::uintptr_t>(stack + size) & ~std::uintptr_t{15}) - 16;  // rsp after `ret`
  auto** sp = reinterpret_cast<void**>(top - 7 * sizeof(void*));
  sp[0] = sp[1] = sp[2] = nullptr;  // r15, r14, r13
  sp[3] = arg;                       // r12: the trampoline's argument
  sp[4] = sp[5] = nullptr;           // rbx, rbp
  sp[6] = reinterpret_cast<void*>(&fairkv_emu_trampoline);
  c.sp = sp;
}
#else
struct context {
  ucontext_t uc;
};
inline void switch_context(context& from, context& to) { swapcontext(&from.uc, &to.uc); }
void fiber_entry(unsigned lo, unsigned hi) {
  fairkv_emu_fiber_main(reinterpret_cast<void*>((static_cast<std::uintptr_t>(hi) << 32) | lo));
}
inline void make_context(context& c, char* stack, std::size_t size, void* arg) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  const auto a = reinterpret_cast<std::uintptr_t>(arg);
  makecontext(&c.uc, reinterpret_cast<void (*)()>(&fiber_entry), 2, static_cast<unsigned>(a),
              static_cast<unsigned>(a >> 32));
}
#endif

// ---- blocks and their threads -------------------------------------------------------------------------------------
enum class state { ready, wait_block, wait_warp, done };

struct warp_state {
  unsigned arrived = 0;  // lanes that reached the current collective
  unsigned gen = 0;      // completed collectives
  std::uint64_t words[32] = {};
};

struct worker;

struct block_state : block_coords {
  unsigned n = 0;        // threads
  unsigned arrived = 0;  // threads at the current __syncthreads
  unsigned gen = 0;      // completed __syncthreads
  unsigned exited = 0;
  warp_state warps[32];
  const std::function<void()>* body = nullptr;
};

struct fiber : thread_coords {
  unsigned linear = 0;
  state st = state::ready;
  unsigned wait_gen = 0;
  context ctx;
  worker* owner = nullptr;
};

constexpr std::size_t stack_bytes = 256 * 1024;  // a kernel's by-value parameters alone are up to 32 KiB

struct worker {
  context scheduler;
  std::vector<fiber> fibers;
  char* stacks = nullptr;  // fibers.size() stacks, each below a guard page
  std::size_t stack_count = 0;
  block_state block;
  std::vector<unsigned char> smem;  // dynamic shared memory, 64 bytes of slack for the alignment

  ~worker() {
    if (stacks != nullptr) munmap(stacks, stack_count * slot());
  }
  static std::size_t page() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }
  static std::size_t slot() { return stack_bytes + page(); }  // one stack and the guard page below it

  void reserve(unsigned threads) {
    if (threads <= stack_count) return;
    if (stacks != nullptr) munmap(stacks, stack_count * slot());
    void* m = mmap(nullptr, threads * slot(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) fail("cannot map fiber stacks");
    stacks = static_cast<char*>(m);
    stack_count = threads;
    for (std::size_t i = 0; i < threads; ++i) mprotect(stacks + i * slot(), page(), PROT_NONE);  // overflow traps
    fibers.assign(threads, fiber{});
  }
  char* stack_of(unsigned i) const { return stacks + i * slot() + page(); }

  void run_block(dim3 grid, dim3 dim, uint3 idx, std::size_t dyn, const std::function<void()>& body,
                 std::uint64_t linear_block);
  [[noreturn]] void deadlock();
};

void worker::run_block(dim3 grid, dim3 dim, uint3 idx, std::size_t dyn, const std::function<void()>& body,
                       std::uint64_t linear_block) {
  const unsigned n = dim.x * dim.y * dim.z;
  reserve(n);
  if (dyn + 64 > smem.size()) smem.resize(dyn + 64);
  auto* aligned = reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(smem.data()) + 63) & ~std::uintptr_t{63});
  if (dyn > 0) std::memset(aligned, 0xA5, dyn);  // CUDA's shared memory starts as garbage
  block.idx = idx;
  block.dim = dim;
  block.grid = grid;
  block.dynamic_smem = dyn > 0 ? aligned : nullptr;
  block.n = n;
  block.arrived = block.gen = block.exited = 0;
  for (auto& w : block.warps) w = warp_state{};
  block.body = &body;
  for (unsigned i = 0; i < n; ++i) {
    fiber& f = fibers[i];
    f.idx = {i % dim.x, (i / dim.x) % dim.y, i / (dim.x * dim.y)};
    f.block = &block;
    f.linear = i;
    f.st = state::ready;
    f.owner = this;
    make_context(f.ctx, stack_of(i), stack_bytes, &f);
  }
  // Rounds alternate their direction (and odd blocks start backwards), so that a missing barrier shows up.
  bool forward = (linear_block & 1u) == 0;
  unsigned live = n;
  while (live > 0) {
    bool progressed = false;
    for (unsigned k = 0; k < n; ++k) {
      fiber& f = fibers[forward ? k : n - 1 - k];
      if (f.st == state::done) continue;
      if (f.st == state::wait_block && block.gen == f.wait_gen) continue;
      if (f.st == state::wait_warp && block.warps[f.linear / 32].gen == f.wait_gen) continue;
      f.st = state::ready;
      current = &f;
      switch_context(scheduler, f.ctx);
      current = nullptr;
      progressed = true;
      if (f.st == state::done) --live;
    }
    forward = !forward;
    if (!progressed) deadlock();
  }
}

void worker::deadlock() {
  unsigned at_block = 0, at_warp = 0, done = 0;
  for (unsigned i = 0; i < block.n; ++i) {
    at_block += fibers[i].st == state::wait_block;
    at_warp += fibers[i].st == state::wait_warp;
    done += fibers[i].st == state::done;
  }
  char msg[256];
  std::snprintf(msg, sizeof msg,
                "deadlock in block (%u, %u, %u): %u threads wait at __syncthreads, %u at a warp collective, %u exited",
                block.idx.x, block.idx.y, block.idx.z, at_block, at_warp, done);
  fail(msg);
}

block_state& block_of(const fiber& f) { return *static_cast<block_state*>(const_cast<block_coords*>(f.block)); }

fiber& self_fiber() {
  if (current == nullptr) fail("a device function was called outside a kernel");
  return *static_cast<fiber*>(const_cast<thread_coords*>(current));
}

void yield(fiber& f) {
  worker& w = *f.owner;
  switch_context(f.ctx, w.scheduler);
}

[[noreturn]] void run_fiber(fiber* f) {
  block_state* b = &block_of(*f);
  (*b->body)();
  f->st = state::done;
  ++b->exited;
  switch_context(f->ctx, f->owner->scheduler);
  fail("a finished fiber was resumed");
}

}  // namespace

void syncthreads() {
  fiber& f = self_fiber();
  block_state& b = block_of(f);
  if (b.exited > 0) {
    char msg[160];
    std::snprintf(msg, sizeof msg, "__syncthreads in block (%u, %u, %u) after %u of its threads exited", b.idx.x,
                  b.idx.y, b.idx.z, b.exited);
    fail(msg);
  }
  if (++b.arrived == b.n) {
    b.arrived = 0;
    ++b.gen;
    return;
  }
  f.st = state::wait_block;
  f.wait_gen = b.gen;
  yield(f);
}

namespace {
void warp_barrier(fiber& f, unsigned mask) {
  block_state& b = block_of(f);
  const unsigned lane = f.linear % 32, warp = f.linear / 32;
  const unsigned lanes_here = std::min(32u, b.n - warp * 32);
  const unsigned exists = lanes_here == 32 ? 0xFFFFFFFFu : (1u << lanes_here) - 1u;
  if (((mask >> lane) & 1u) == 0) fail("a warp collective was called by a lane outside its mask");
  if ((mask & ~exists) != 0) fail("a warp collective's mask names lanes that the block does not have");
  warp_state& w = b.warps[warp];
  w.arrived |= 1u << lane;
  if ((w.arrived & mask) == mask) {
    w.arrived &= ~mask;
    ++w.gen;
    return;
  }
  f.st = state::wait_warp;
  f.wait_gen = w.gen;
  yield(f);
}
}  // namespace

void syncwarp(unsigned mask) { warp_barrier(self_fiber(), mask); }

const std::uint64_t* warp_publish(unsigned mask, std::uint64_t word, unsigned& lane) {
  fiber& f = self_fiber();
  block_state& b = block_of(f);
  lane = f.linear % 32;
  warp_state& w = b.warps[f.linear / 32];
  w.words[lane] = word;
  warp_barrier(f, mask);
  return w.words;
}

void warp_done(unsigned mask) { warp_barrier(self_fiber(), mask); }

void spin_hint() noexcept {
  thread_local unsigned calls = 0;
  if ((++calls & 63u) == 0) std::this_thread::yield();
}

}  // namespace detail

void* dynamic_shared_memory() noexcept {
  return detail::current == nullptr ? nullptr : detail::current->block->dynamic_smem;
}

// ---- the grid scheduler ---------------------------------------------------------------------------------------------
namespace {

using detail::fail;

struct grid_job {
  dim3 grid, block;
  std::size_t smem = 0;
  const std::function<void()>* body = nullptr;
  std::uint64_t blocks = 0;
};

// Persistent worker threads (the "resident blocks"): FAIRKV_EMU_WORKERS, default 4 (more than this machine's cores
// on purpose: the OS then preempts blocks mid-protocol).
class pool {
 public:
  pool() {
    const char* env = std::getenv("FAIRKV_EMU_WORKERS");
    const int n = env != nullptr ? std::max(1, std::atoi(env)) : 4;
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~pool() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void run(const grid_job& job) {
    std::lock_guard<std::mutex> one_grid_at_a_time(run_m_);
    std::unique_lock<std::mutex> lock(m_);
    job_ = &job;
    next_.store(0);
    busy_ = static_cast<unsigned>(threads_.size());
    ++epoch_;
    cv_.notify_all();
    done_cv_.wait(lock, [&] { return busy_ == 0; });
    job_ = nullptr;
  }

 private:
  void loop() {
    detail::worker w;
    std::uint64_t seen = 0;
    for (;;) {
      const grid_job* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return stop_ || epoch_ != seen; });
        if (stop_) return;
        seen = epoch_;
        job = job_;
      }
      for (std::uint64_t b = next_.fetch_add(1); b < job->blocks; b = next_.fetch_add(1)) {
        const dim3 g = job->grid;
        const uint3 idx{static_cast<unsigned>(b % g.x), static_cast<unsigned>((b / g.x) % g.y),
                        static_cast<unsigned>(b / (static_cast<std::uint64_t>(g.x) * g.y))};
        w.run_block(g, job->block, idx, job->smem, *job->body, b);
      }
      std::lock_guard<std::mutex> lock(m_);
      if (--busy_ == 0) done_cv_.notify_all();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex run_m_, m_;
  std::condition_variable cv_, done_cv_;
  const grid_job* job_ = nullptr;
  std::atomic<std::uint64_t> next_{0};
  unsigned busy_ = 0;
  std::uint64_t epoch_ = 0;
  bool stop_ = false;
};

pool& the_pool() {
  static pool p;
  return p;
}

// ---- runtime state ------------------------------------------------------------------------------------------------
thread_local cudaError_t last_error = cudaSuccess;

cudaError_t record(cudaError_t e) noexcept {
  if (e != cudaSuccess) last_error = e;
  return e;
}

std::mutex alloc_mutex;
std::map<std::uintptr_t, std::size_t> allocations;  // device "allocations": base -> bytes

bool is_device_range(const void* p, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(alloc_mutex);
  const auto u = reinterpret_cast<std::uintptr_t>(p);
  auto it = allocations.upper_bound(u);
  if (it == allocations.begin()) return false;
  --it;
  return u >= it->first && u + bytes <= it->first + it->second;
}

}  // namespace
}  // namespace fairkv_emu

extern "C" void fairkv_emu_fiber_main(void* arg) {
  fairkv_emu::detail::run_fiber(static_cast<fairkv_emu::detail::fiber*>(arg));
}

struct CUstream_st {
  bool capturing = false;
  bool invalidated = false;
  std::thread::id capturer;
  std::vector<std::function<void()>> ops;
};
struct CUgraph_st {
  std::vector<std::function<void()>> ops;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> ops;
};

namespace fairkv_emu {
namespace {

CUstream_st legacy_stream;
thread_local CUstream_st* capturing_here = nullptr;  // the stream this host thread is capturing (ThreadLocal mode)

CUstream_st* resolve(cudaStream_t s) { return s == nullptr ? &legacy_stream : s; }

// A call that would wait for the device or allocate while this thread captures: refused, and the capture is
// invalidated, as CUDA does in the global and thread-local capture modes.
bool refuse_during_capture() {
  if (capturing_here == nullptr) return false;
  capturing_here->invalidated = true;
  return true;
}

// Runs `op` now, or appends it to the stream's capture.
void enqueue(cudaStream_t stream, std::function<void()> op) {
  CUstream_st* s = resolve(stream);
  if (s->capturing) {
    s->ops.push_back(std::move(op));
    return;
  }
  op();
}

}  // namespace

namespace {
std::mutex attribute_mutex;
std::map<const void*, std::size_t> optin_smem;  // kernel -> its MaxDynamicSharedMemorySize attribute
thread_local std::uint64_t submitted = 0;
thread_local std::uint64_t fail_at = 0;  // 0: no injected failure
}  // namespace

std::uint64_t launches_submitted() noexcept { return submitted; }
void fail_launch(std::uint64_t nth) noexcept { fail_at = nth == 0 ? 0 : submitted + nth; }

cudaError_t set_function_attribute(const void* kernel, cudaFuncAttribute attr, int value) noexcept {
  if (kernel == nullptr || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      static_cast<std::size_t>(value) > optin_dynamic_smem)
    return record(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(attribute_mutex);
  optin_smem[kernel] = static_cast<std::size_t>(value);
  return cudaSuccess;
}

void submit(const void* kernel, cudaStream_t stream, dim3 grid, dim3 block, std::size_t dynamic_smem,
            std::function<void()> body) {
  ++submitted;
  if (fail_at != 0 && submitted == fail_at) {
    fail_at = 0;
    record(cudaErrorLaunchOutOfResources);
    return;
  }
  const std::uint64_t threads = static_cast<std::uint64_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 || grid.x == 0 ||
      grid.y == 0 || grid.z == 0 || grid.x > 0x7FFFFFFFu || grid.y > 65535 || grid.z > 65535) {
    record(cudaErrorInvalidConfiguration);
    return;
  }
  if (dynamic_smem > default_dynamic_smem) {  // only up to what the kernel opted in to
    std::size_t allowed = default_dynamic_smem;
    {
      std::lock_guard<std::mutex> lock(attribute_mutex);
      if (auto it = optin_smem.find(kernel); it != optin_smem.end()) allowed = it->second;
    }
    if (dynamic_smem > allowed) {
      record(cudaErrorInvalidValue);
      return;
    }
  }
  auto job = std::make_shared<grid_job>();
  job->grid = grid;
  job->block = block;
  job->smem = dynamic_smem;
  job->blocks = static_cast<std::uint64_t>(grid.x) * grid.y * grid.z;
  auto fn = std::make_shared<std::function<void()>>(std::move(body));
  enqueue(stream, [job, fn] {
    job->body = fn.get();
    the_pool().run(*job);
  });
}

}  // namespace fairkv_emu

// ---- the runtime API ------------------------------------------------------------------------------------------------
using namespace fairkv_emu;

const char* cudaGetErrorName(cudaError_t e) noexcept {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t e) noexcept {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched: return "capture was not initiated in this stream";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
  }
  return "unknown error";
}
cudaError_t cudaGetLastError() noexcept {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaGetDeviceCount(int* count) noexcept {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) noexcept {
  if (device != 0) return record(cudaErrorInvalidValue);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "fairkv CUDA emulator (kernels on host CPU threads, not a GPU)");
  prop->multiProcessorCount = 1;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) noexcept {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) noexcept {
  if (device != 0 || attr != cudaDevAttrMaxSharedMemoryPerBlockOptin) return record(cudaErrorInvalidValue);
  *value = static_cast<int>(optin_dynamic_smem);
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, std::size_t bytes) noexcept {
  if (refuse_during_capture()) return record(cudaErrorStreamCaptureUnsupported);
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, rounded);
  if (p == nullptr) return record(cudaErrorMemoryAllocation);
  std::memset(p, 0xCD, rounded);  // device memory starts as garbage
  {
    std::lock_guard<std::mutex> lock(alloc_mutex);
    allocations[reinterpret_cast<std::uintptr_t>(p)] = bytes;
  }
  *ptr = p;
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) noexcept {
  if (ptr == nullptr) return cudaSuccess;
  if (refuse_during_capture()) return record(cudaErrorStreamCaptureUnsupported);
  {
    std::lock_guard<std::mutex> lock(alloc_mutex);
    if (allocations.erase(reinterpret_cast<std::uintptr_t>(ptr)) == 0) return record(cudaErrorInvalidDevicePointer);
  }
  std::free(ptr);
  return cudaSuccess;
}

namespace {
cudaError_t check_copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost) return cudaSuccess;
  if ((dst_dev && !is_device_range(dst, bytes)) || (src_dev && !is_device_range(src, bytes)))
    return cudaErrorInvalidValue;
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) noexcept {
  if (refuse_during_capture()) return record(cudaErrorStreamCaptureUnsupported);
  if (const cudaError_t e = check_copy(dst, src, bytes, kind); e != cudaSuccess) return record(e);
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) noexcept {
  if (const cudaError_t e = check_copy(dst, src, bytes, kind); e != cudaSuccess) return record(e);
  if (bytes > 0) enqueue(stream, [=] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemset(void* dst, int value, std::size_t bytes) noexcept {
  if (refuse_during_capture()) return record(cudaErrorStreamCaptureUnsupported);
  return cudaMemsetAsync(dst, value, bytes, nullptr);
}
cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t stream) noexcept {
  if (bytes == 0) return cudaSuccess;
  if (!is_device_range(dst, bytes)) return record(cudaErrorInvalidValue);
  enqueue(stream, [=] { std::memset(dst, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) noexcept {
  *stream = new CUstream_st{};
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) noexcept {
  if (stream == nullptr) return record(cudaErrorInvalidResourceHandle);
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) noexcept {
  if (refuse_during_capture()) return record(cudaErrorStreamCaptureUnsupported);
  return cudaSuccess;  // every operation has already run
}
cudaError_t cudaDeviceSynchronize() noexcept {
  if (refuse_during_capture()) return record(cudaErrorStreamCaptureUnsupported);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) noexcept {
  if (stream == nullptr) return record(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot capture
  if (stream->capturing || capturing_here != nullptr) return record(cudaErrorInvalidValue);
  stream->capturing = true;
  stream->invalidated = false;
  stream->capturer = std::this_thread::get_id();
  stream->ops.clear();
  capturing_here = stream;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) noexcept {
  if (stream == nullptr || !stream->capturing || stream->capturer != std::this_thread::get_id())
    return record(cudaErrorStreamCaptureUnmatched);
  stream->capturing = false;
  capturing_here = nullptr;
  *graph = nullptr;
  if (stream->invalidated) {
    stream->ops.clear();
    return record(cudaErrorStreamCaptureInvalidated);
  }
  *graph = new CUgraph_st{std::move(stream->ops)};
  stream->ops.clear();
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) noexcept {
  if (graph == nullptr) return record(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->ops};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) noexcept {
  if (exec == nullptr) return record(cudaErrorInvalidValue);
  for (const auto& op : exec->ops) enqueue(stream, op);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) noexcept {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) noexcept {
  delete graph;
  return cudaSuccess;
}
