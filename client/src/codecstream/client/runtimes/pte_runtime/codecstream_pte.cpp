// codecstream_pte.h over ExecuTorch's C++ runtime (Program, Method, the mmap data loader).
//
// Safety: a decoder program may come from a server the client does not trust, so nothing here
// may abort the process. ExecuTorch reports what it checks as an Error, and this file turns each
// into a status and a message; what it would otherwise reach through an unchecked path (an
// index, a size, a tag) is checked here first:
//   - the file's header (Program::check_header) before anything else reads it;
//   - the whole flatbuffer (Program::Verification::InternalConsistency) before any table in it
//     is followed; XNNPACK verifies its own flatbuffer when the method loads its delegate;
//   - the memory plan's sizes, every input and output tag, every index a caller passes;
//   - every input's dtype, rank and sizes against the method's before the method sees it.
// C++ exceptions (an allocation that fails) are caught at the C boundary.

#include "codecstream_pte.h"

#include <executorch/extension/data_loader/mmap_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/executor/memory_manager.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/method_meta.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#ifndef CS_EXECUTORCH_VERSION
#define CS_EXECUTORCH_VERSION "unknown"
#endif

// The wheel ships the thread pool's library but not its header (extension/threadpool/threadpool.h);
// these are the two members of its ThreadPool this file calls, as that library exports them.
namespace executorch::extension::threadpool {
class ThreadPool {
 public:
  size_t get_thread_count() const;
  bool _unsafe_reset_threadpool(uint32_t num_threads);
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool

namespace {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::aten::TensorImpl;
using executorch::extension::MallocMemoryAllocator;
using executorch::extension::MmapDataLoader;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::HierarchicalAllocator;
using executorch::runtime::MemoryManager;
using executorch::runtime::Method;
using executorch::runtime::MethodMeta;
using executorch::runtime::Program;
using executorch::runtime::Span;
using executorch::runtime::Tag;
using executorch::runtime::TensorInfo;

constexpr const char* kMethod = "forward";
// Far above what a decoder plans (tens of MB at real size); a bit-flipped plan asks for more.
constexpr int64_t kMaxPlannedBytes = int64_t{16} << 30;

thread_local std::string last_error;
// ExecuTorch's own last error line on this thread: it says what a check found (which table,
// which index), so it joins the message of the Error it precedes.
thread_local std::string last_log;

int fail(std::string message) {
  last_error = std::move(message);
  return 1;
}

int fail(const std::string& what, Error error) {
  std::string message = what + ": " + executorch::runtime::to_string(error) + " (ExecuTorch error " +
                        std::to_string(static_cast<int>(error)) + ")";
  if (!last_log.empty()) message += "; ExecuTorch says: " + last_log;
  return fail(message);
}

// ExecuTorch logs to stderr by default, information lines included, on every load; a library
// keeps quiet and hands the errors back instead.
void keep_error_lines(et_timestamp_t, et_pal_log_level_t level, const char*, const char*, size_t,
                      const char* message, size_t length) {
  if (level != kError && level != kFatal) return;
  last_log.assign(message, length);
  while (!last_log.empty() && (last_log.back() == '\n' || last_log.back() == '\r')) last_log.pop_back();
  for (char& c : last_log) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  }
}

// The C boundary: an exception thrown below (std::bad_alloc) becomes a status and a message.
template <typename Body>
int guarded(const char* what, Body body) noexcept {
  try {
    last_error.clear();
    last_log.clear();
    return body();
  } catch (const std::exception& error) {
    return fail(std::string(what) + ": " + error.what());
  } catch (...) {
    return fail(std::string(what) + ": unknown C++ exception");
  }
}

size_t element_size(int32_t dtype) {
  switch (dtype) {
    case CS_PTE_INT64:
      return 8;
    case CS_PTE_FLOAT32:
      return 4;
    case CS_PTE_BFLOAT16:
      return 2;
    default:
      return 0;
  }
}

void init_runtime() {
  static std::once_flag once;
  std::call_once(once, [] {
    executorch::runtime::register_pal(executorch::runtime::PalImpl::create(keep_error_lines, __FILE__));
    executorch::runtime::runtime_init();
  });
}

}  // namespace

struct cs_pte_program {
  // Declared in the order they are made: each holds pointers into the ones above it, and members
  // are destroyed in reverse order.
  std::unique_ptr<MmapDataLoader> loader;
  std::optional<Program> program;
  std::optional<MethodMeta> meta;
  MallocMemoryAllocator method_allocator;
  MallocMemoryAllocator temp_allocator;
  std::vector<std::unique_ptr<uint8_t[]>> planned;
  std::vector<Span<uint8_t>> planned_spans;
  std::optional<HierarchicalAllocator> planned_allocator;
  std::optional<MemoryManager> memory_manager;
  std::optional<Method> method;
};

namespace {

int check_header(const char* path) {
  std::FILE* file = std::fopen(path, "rb");
  if (file == nullptr) {
    return fail(std::string(path) + ": cannot open: " + std::strerror(errno));
  }
  unsigned char head[Program::kMinHeadBytes];
  size_t read = std::fread(head, 1, sizeof(head), file);
  std::fclose(file);
  switch (Program::check_header(head, read)) {
    case Program::HeaderStatus::CompatibleVersion:
      return 0;
    case Program::HeaderStatus::IncompatibleVersion: {
      std::string found(reinterpret_cast<const char*>(head) + 4, 4);
      for (char& c : found) {
        if (c < 0x20 || c > 0x7e) c = '?';
      }
      return fail(std::string(path) + " is an ExecuTorch program of another format version ('" + found +
                  "'); this runtime is ExecuTorch " CS_EXECUTORCH_VERSION);
    }
    case Program::HeaderStatus::ShortData:
      return fail(std::string(path) + " is not an ExecuTorch program: " + std::to_string(read) +
                  " bytes, too short for one");
    default:
      return fail(std::string(path) + " is not an ExecuTorch program: no ExecuTorch header at bytes 4-8");
  }
}

// Tensor info of input or output `index`, checked to be a tensor.
int tensor_info(const cs_pte_program* program, int32_t output, int32_t index, std::optional<TensorInfo>& info) {
  const MethodMeta& meta = *program->meta;
  size_t count = output ? meta.num_outputs() : meta.num_inputs();
  const char* kind = output ? "output" : "input";
  if (index < 0 || static_cast<size_t>(index) >= count) {
    return fail(std::string(kind) + " index " + std::to_string(index) + " out of range: the method has " +
                std::to_string(count));
  }
  auto tag = output ? meta.output_tag(index) : meta.input_tag(index);
  if (!tag.ok()) return fail(std::string(kind) + " " + std::to_string(index), tag.error());
  if (*tag != Tag::Tensor) {
    return fail(std::string(kind) + " " + std::to_string(index) + " is not a tensor");
  }
  auto result = output ? meta.output_tensor_meta(index) : meta.input_tensor_meta(index);
  if (!result.ok()) return fail(std::string(kind) + " " + std::to_string(index), result.error());
  if (result->sizes().size() > CS_PTE_MAX_RANK) {
    return fail(std::string(kind) + " " + std::to_string(index) + " has rank " +
                std::to_string(result->sizes().size()) + ", more than " + std::to_string(CS_PTE_MAX_RANK));
  }
  info.emplace(*result);
  return 0;
}

int open_program(const char* path, cs_pte_program** out) {
  if (path == nullptr || out == nullptr) return fail("cs_pte_open: null argument");
  *out = nullptr;
  init_runtime();
  if (check_header(path) != 0) return 1;
  auto program = std::make_unique<cs_pte_program>();
  auto loader = MmapDataLoader::from(path, MmapDataLoader::MlockConfig::NoMlock);
  if (!loader.ok()) return fail(std::string(path) + ": cannot map", loader.error());
  program->loader = std::make_unique<MmapDataLoader>(std::move(*loader));
  auto loaded = Program::load(program->loader.get(), Program::Verification::InternalConsistency);
  if (!loaded.ok()) return fail(std::string(path) + ": not a valid ExecuTorch program", loaded.error());
  program->program.emplace(std::move(*loaded));
  auto meta = program->program->method_meta(kMethod);
  if (!meta.ok()) return fail(std::string(path) + ": no method \"forward\"", meta.error());
  program->meta.emplace(*meta);

  int64_t total = 0;
  for (size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
    auto size = meta->memory_planned_buffer_size(i);
    if (!size.ok()) return fail(std::string(path) + ": memory plan", size.error());
    if (*size < 0 || *size > kMaxPlannedBytes - total) {
      return fail(std::string(path) + ": memory plan asks for more than " + std::to_string(kMaxPlannedBytes >> 30) +
                  " GiB");
    }
    total += *size;
    // Not zeroed: pages the method never touches stay out of the resident set.
    program->planned.emplace_back(new uint8_t[static_cast<size_t>(*size)]);
    program->planned_spans.emplace_back(program->planned.back().get(), static_cast<size_t>(*size));
  }
  program->planned_allocator.emplace(Span<Span<uint8_t>>(program->planned_spans.data(), program->planned_spans.size()));
  program->memory_manager.emplace(&program->method_allocator, &*program->planned_allocator, &program->temp_allocator);
  for (int32_t output = 0; output < 2; ++output) {
    size_t count = output ? meta->num_outputs() : meta->num_inputs();
    for (size_t i = 0; i < count; ++i) {
      std::optional<TensorInfo> info;
      if (tensor_info(program.get(), output, static_cast<int32_t>(i), info) != 0) {
        return fail(std::string(path) + ": " + last_error + " (a decoder program takes and returns tensors only)");
      }
    }
  }
  auto method = program->program->load_method(kMethod, &*program->memory_manager);
  if (!method.ok()) return fail(std::string(path) + ": cannot load method \"forward\"", method.error());
  program->method.emplace(std::move(*method));
  if (program->method->inputs_size() != meta->num_inputs() || program->method->outputs_size() != meta->num_outputs()) {
    return fail(std::string(path) + ": the method's inputs or outputs differ from its metadata");
  }
  *out = program.release();
  return 0;
}

int describe(const cs_pte_program* program, int32_t output, int32_t index, cs_pte_tensor* info) {
  if (program == nullptr || info == nullptr) return fail("cs_pte_describe: null argument");
  std::optional<TensorInfo> meta;
  if (tensor_info(program, output, index, meta) != 0) return 1;
  *info = cs_pte_tensor{};
  info->dtype = static_cast<int32_t>(meta->scalar_type());
  info->rank = static_cast<int32_t>(meta->sizes().size());
  for (int32_t d = 0; d < info->rank; ++d) info->sizes[d] = meta->sizes()[d];
  info->nbytes = meta->nbytes();
  return 0;
}

int run(cs_pte_program* program, const cs_pte_tensor* inputs, int32_t count) {
  if (program == nullptr || (inputs == nullptr && count != 0)) return fail("cs_pte_run: null argument");
  const MethodMeta& meta = *program->meta;
  if (count < 0 || static_cast<size_t>(count) != meta.num_inputs()) {
    return fail("the method takes " + std::to_string(meta.num_inputs()) + " inputs, " + std::to_string(count) +
                " given");
  }
  for (int32_t i = 0; i < count; ++i) {
    const cs_pte_tensor& input = inputs[i];
    std::optional<TensorInfo> info;
    if (tensor_info(program, 0, i, info) != 0) return 1;
    std::string where = "input " + std::to_string(i);
    int32_t dtype = static_cast<int32_t>(info->scalar_type());
    if (input.dtype != dtype) {
      return fail(where + " has dtype " + std::to_string(input.dtype) + ", the method takes " + std::to_string(dtype));
    }
    Span<const int32_t> bounds = info->sizes();
    if (input.rank != static_cast<int32_t>(bounds.size())) {
      return fail(where + " has rank " + std::to_string(input.rank) + ", the method takes " +
                  std::to_string(bounds.size()));
    }
    size_t elements = 1;
    for (int32_t d = 0; d < input.rank; ++d) {
      if (input.sizes[d] < 1 || input.sizes[d] > bounds[d]) {
        return fail(where + " dimension " + std::to_string(d) + " is " + std::to_string(input.sizes[d]) +
                    ", the method takes 1 to " + std::to_string(bounds[d]));
      }
      elements *= static_cast<size_t>(input.sizes[d]);
    }
    if (input.data == nullptr || input.nbytes != elements * element_size(dtype)) {
      return fail(where + " holds " + std::to_string(input.nbytes) + " bytes, its sizes need " +
                  std::to_string(elements * element_size(dtype)));
    }
  }
  for (int32_t i = 0; i < count; ++i) {
    const cs_pte_tensor& input = inputs[i];
    executorch::aten::SizesType sizes[CS_PTE_MAX_RANK];
    executorch::aten::DimOrderType dim_order[CS_PTE_MAX_RANK];
    executorch::aten::StridesType strides[CS_PTE_MAX_RANK];
    executorch::aten::StridesType stride = 1;
    for (int32_t d = input.rank - 1; d >= 0; --d) {
      sizes[d] = static_cast<executorch::aten::SizesType>(input.sizes[d]);
      dim_order[d] = static_cast<executorch::aten::DimOrderType>(d);
      strides[d] = stride;
      stride *= sizes[d];
    }
    TensorImpl impl(static_cast<ScalarType>(input.dtype), input.rank, sizes, input.data, dim_order, strides);
    Error error = program->method->set_input(EValue(Tensor(&impl)), static_cast<size_t>(i));
    if (error != Error::Ok) return fail("input " + std::to_string(i), error);
  }
  Error error = program->method->execute();
  if (error != Error::Ok) return fail("the method failed", error);
  return 0;
}

int output(const cs_pte_program* program, int32_t index, cs_pte_tensor* out) {
  if (program == nullptr || out == nullptr) return fail("cs_pte_output: null argument");
  size_t count = program->method->outputs_size();
  if (index < 0 || static_cast<size_t>(index) >= count) {
    return fail("output index " + std::to_string(index) + " out of range: the method has " + std::to_string(count));
  }
  const EValue& value = program->method->get_output(static_cast<size_t>(index));
  if (!value.isTensor()) return fail("output " + std::to_string(index) + " is not a tensor");
  const Tensor& tensor = value.toTensor();
  if (tensor.dim() > CS_PTE_MAX_RANK) return fail("output " + std::to_string(index) + " has too many dimensions");
  *out = cs_pte_tensor{};
  out->dtype = static_cast<int32_t>(tensor.scalar_type());
  out->rank = static_cast<int32_t>(tensor.dim());
  for (int32_t d = 0; d < out->rank; ++d) out->sizes[d] = tensor.size(d);
  out->data = const_cast<void*>(tensor.const_data_ptr());
  out->nbytes = tensor.nbytes();
  return 0;
}

}  // namespace

extern "C" {

const char* cs_pte_last_error(void) { return last_error.c_str(); }

const char* cs_pte_executorch_version(void) { return CS_EXECUTORCH_VERSION; }

int cs_pte_set_threads(int32_t threads) {
  return guarded("cs_pte_set_threads", [&] {
    if (threads < 1) return fail("threads must be at least 1, not " + std::to_string(threads));
    init_runtime();
    auto* pool = executorch::extension::threadpool::get_threadpool();
    if (pool == nullptr) return fail("ExecuTorch's thread pool is unavailable");
    if (pool->get_thread_count() == static_cast<size_t>(threads)) return 0;
    if (!pool->_unsafe_reset_threadpool(static_cast<uint32_t>(threads))) {
      return fail("ExecuTorch's thread pool could not be resized to " + std::to_string(threads));
    }
    return 0;
  });
}

int32_t cs_pte_threads(void) {
  init_runtime();
  auto* pool = executorch::extension::threadpool::get_threadpool();
  return pool == nullptr ? 0 : static_cast<int32_t>(pool->get_thread_count());
}

int cs_pte_open(const char* path, cs_pte_program** program) {
  return guarded("cs_pte_open", [&] { return open_program(path, program); });
}

void cs_pte_close(cs_pte_program* program) { delete program; }

int32_t cs_pte_num_inputs(const cs_pte_program* program) {
  return program == nullptr ? -1 : static_cast<int32_t>(program->meta->num_inputs());
}

int32_t cs_pte_num_outputs(const cs_pte_program* program) {
  return program == nullptr ? -1 : static_cast<int32_t>(program->meta->num_outputs());
}

int cs_pte_describe(const cs_pte_program* program, int32_t output, int32_t index, cs_pte_tensor* info) {
  return guarded("cs_pte_describe", [&] { return describe(program, output, index, info); });
}

int cs_pte_run(cs_pte_program* program, const cs_pte_tensor* inputs, int32_t count) {
  return guarded("cs_pte_run", [&] { return run(program, inputs, count); });
}

int cs_pte_output(const cs_pte_program* program, int32_t index, cs_pte_tensor* out) {
  return guarded("cs_pte_output", [&] { return output(program, index, out); });
}

int64_t cs_pte_peak_rss_bytes(void) {
  std::FILE* status = std::fopen("/proc/self/status", "r");
  if (status == nullptr) return 0;
  char line[256];
  int64_t kib = 0;
  while (std::fgets(line, sizeof(line), status) != nullptr) {
    if (std::sscanf(line, "VmHWM: %lld kB", reinterpret_cast<long long*>(&kib)) == 1) break;
  }
  std::fclose(status);
  return kib * 1024;
}

}  // extern "C"
