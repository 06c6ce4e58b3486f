// codecstream-pte-runner: what an app on ExecuTorch's C++ runtime sees of a stateful decoder .pte.
//
//   codecstream-pte-runner decoder.pte [--threads 2] [--chunks 1,2,4,8,16,25] [--calls 20] [--json]
//
// Opens the program (load), decodes the first 2-frame chunk of a fresh stream (first chunk: the
// program's first execution, so it includes what the runtime does on a first call), then per chunk
// size C one untimed call and --calls timed ones along a stream that carries its state (steady
// per-call median, p90, min), and reports the process's peak resident memory. Codes are random
// (seeded); the state starts at zeros, as a client's does. Uses only codecstream_pte.h.


#include "codecstream_pte.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string path;
  int threads = 2;
  std::vector<int> chunks = {1, 2, 4, 8, 16, 25};
  int calls = 20;
  unsigned seed = 3;
  bool json = false;
};

[[noreturn]] void usage(const char* error) {
  std::fprintf(stderr,
               "%s\nusage: codecstream-pte-runner FILE.pte [--threads N] [--chunks 1,2,4,...] [--calls N] "
               "[--seed S] [--json]\n",
               error);
  std::exit(2);
}

int positive(const char* text, const char* what) {
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 1 || value > 100000) usage((std::string("bad ") + what).c_str());
  return static_cast<int>(value);
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(("missing value after " + arg).c_str());
      return argv[++i];
    };
    if (arg == "--threads") {
      options.threads = positive(value(), "--threads");
    } else if (arg == "--calls") {
      options.calls = positive(value(), "--calls");
    } else if (arg == "--seed") {
      options.seed = static_cast<unsigned>(positive(value(), "--seed"));
    } else if (arg == "--chunks") {
      options.chunks.clear();
      std::string list = value();
      for (size_t start = 0; start <= list.size();) {
        size_t comma = list.find(',', start);
        if (comma == std::string::npos) comma = list.size();
        options.chunks.push_back(positive(list.substr(start, comma - start).c_str(), "--chunks"));
        start = comma + 1;
      }
    } else if (arg == "--json") {
      options.json = true;
    } else if (!arg.empty() && arg[0] == '-') {
      usage(("unknown option " + arg).c_str());
    } else if (options.path.empty()) {
      options.path = arg;
    } else {
      usage("more than one file given");
    }
  }
  if (options.path.empty()) usage("no .pte file given");
  return options;
}

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "codecstream-pte-runner: %s: %s\n", what, cs_pte_last_error());
  std::exit(1);
}

double ms_since(Clock::time_point began) {
  return std::chrono::duration<double, std::milli>(Clock::now() - began).count();
}

// A stream of the stateful decoder: input 0 is the codes (1, C, Q) int64, the others the state;
// output 0 is the PCM, output i the next value of input i.
class Stream {
 public:
  explicit Stream(cs_pte_program* program, unsigned seed) : program_(program), random_(seed) {
    int32_t inputs = cs_pte_num_inputs(program);
    if (inputs < 1 || cs_pte_num_outputs(program) != inputs) {
      std::fprintf(stderr, "codecstream-pte-runner: not a stateful decoder program (%d inputs, %d outputs)\n", inputs,
                   cs_pte_num_outputs(program));
      std::exit(1);
    }
    if (cs_pte_describe(program, 0, 0, &codes_) != 0) die("describe the codes");
    if (codes_.dtype != CS_PTE_INT64 || codes_.rank != 3) {
      std::fprintf(stderr, "codecstream-pte-runner: input 0 is not (1, frames, codebooks) int64 codes\n");
      std::exit(1);
    }
    state_.resize(inputs - 1);
    buffers_.resize(inputs - 1);
    for (int32_t i = 1; i < inputs; ++i) {
      if (cs_pte_describe(program, 0, i, &state_[i - 1]) != 0) die("describe the state");
      buffers_[i - 1].assign(state_[i - 1].nbytes, 0);
      state_[i - 1].data = buffers_[i - 1].data();
    }
  }

  void reset() {
    for (auto& buffer : buffers_) std::fill(buffer.begin(), buffer.end(), 0);
  }

  // Decode `frames` frames of random codes; returns the number of PCM samples.
  size_t decode(int frames) {
    std::vector<int64_t> codes(static_cast<size_t>(frames) * codes_.sizes[2]);
    std::uniform_int_distribution<int64_t> code(0, 2047);
    for (auto& value : codes) value = code(random_);
    std::vector<cs_pte_tensor> inputs;
    cs_pte_tensor chunk = codes_;
    chunk.sizes[1] = frames;
    chunk.data = codes.data();
    chunk.nbytes = codes.size() * sizeof(int64_t);
    inputs.push_back(chunk);
    inputs.insert(inputs.end(), state_.begin(), state_.end());
    if (cs_pte_run(program_, inputs.data(), static_cast<int32_t>(inputs.size())) != 0) die("run");
    cs_pte_tensor pcm;
    if (cs_pte_output(program_, 0, &pcm) != 0) die("read the PCM");
    for (size_t i = 0; i < state_.size(); ++i) {
      cs_pte_tensor next;
      if (cs_pte_output(program_, static_cast<int32_t>(i + 1), &next) != 0) die("read the state");
      if (next.nbytes != buffers_[i].size()) die("the next state's size differs from the state's");
      std::memcpy(buffers_[i].data(), next.data, next.nbytes);
    }
    return pcm.nbytes / sizeof(float);
  }

 private:
  cs_pte_program* program_;
  std::mt19937 random_;
  cs_pte_tensor codes_{};
  std::vector<cs_pte_tensor> state_;
  std::vector<std::vector<unsigned char>> buffers_;
};

double percentile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  double position = q * (values.size() - 1);
  size_t low = static_cast<size_t>(position);
  size_t high = std::min(low + 1, values.size() - 1);
  return values[low] + (values[high] - values[low]) * (position - low);
}

}  // namespace

int main(int argc, char** argv) {
  auto started = Clock::now();
  Options options = parse(argc, argv);
  if (cs_pte_set_threads(options.threads) != 0) die("set the threads");

  auto began = Clock::now();
  cs_pte_program* program = nullptr;
  if (cs_pte_open(options.path.c_str(), &program) != 0) die("open");
  double load_ms = ms_since(began);

  Stream stream(program, options.seed);
  began = Clock::now();
  stream.decode(2);
  double first_ms = ms_since(began);
  double ready_ms = ms_since(started);

  struct Row {
    int chunk;
    double median, p90, min;
  };
  std::vector<Row> rows;
  for (int chunk : options.chunks) {
    stream.reset();
    stream.decode(chunk);
    std::vector<double> times;
    for (int call = 0; call < options.calls; ++call) {
      began = Clock::now();
      stream.decode(chunk);
      times.push_back(ms_since(began));
    }
    rows.push_back({chunk, percentile(times, 0.5), percentile(times, 0.9), *std::min_element(times.begin(), times.end())});
  }
  double peak_rss_mb = cs_pte_peak_rss_bytes() / 1048576.0;
  cs_pte_close(program);

  if (options.json) {
    std::printf("{\"executorch\": \"%s\", \"threads\": %d, \"load_ms\": %.2f, \"first_chunk_2_frames_ms\": %.2f, "
                "\"ready_ms\": %.2f, \"peak_rss_mb\": %.1f, \"calls\": %d, \"chunks\": {",
                cs_pte_executorch_version(), cs_pte_threads(), load_ms, first_ms, ready_ms, peak_rss_mb, options.calls);
    for (size_t i = 0; i < rows.size(); ++i) {
      std::printf("%s\"%d\": {\"median_ms\": %.2f, \"p90_ms\": %.2f, \"min_ms\": %.2f}", i ? ", " : "", rows[i].chunk,
                  rows[i].median, rows[i].p90, rows[i].min);
    }
    std::printf("}}\n");
  } else {
    std::printf("ExecuTorch %s, %d threads\n", cs_pte_executorch_version(), cs_pte_threads());
    std::printf("load %.1f ms, first 2-frame chunk %.1f ms, ready %.1f ms after start\n", load_ms, first_ms, ready_ms);
    for (const Row& row : rows) {
      std::printf("C = %2d: median %.1f ms, p90 %.1f ms, min %.1f ms (%d calls)\n", row.chunk, row.median, row.p90,
                  row.min, options.calls);
    }
    std::printf("peak RSS %.1f MB\n", peak_rss_mb);
  }
  return 0;
}
