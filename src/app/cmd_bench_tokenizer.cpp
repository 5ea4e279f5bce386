// `moeserve bench tokenizer`: encode throughput (MB/s) of moeserve's tokenizer on a corpus
// (tinyshakespeare by default), next to Hugging Face `tokenizers` run on the same machine through
// python3, and their ratio. Writes a BenchResult JSON.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "bench/bench_result.h"
#include "tokenizer/default_paths.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::app {
namespace {

struct BenchTokenizerArgs {
  std::string model;
  std::string corpus;
  std::string out = "results/bench_tokenizer.json";
  std::string python = "python3";
  int reps = 5;
};

std::string find_corpus(const std::string& given) {
  if (!given.empty()) return given;
  const std::string candidates[] = {
      "../shared/data/tinyshakespeare.txt",
      tokenizer::default_tokenizer_dir() + "/../../../shared/data/tinyshakespeare.txt"};
  for (const std::string& c : candidates) {
    std::error_code ec;
    if (std::filesystem::exists(c, ec)) return c;
  }
  return candidates[0];
}

// Runs HF tokenizers in a python3 child; returns {"mb_s", "num_tokens"} or an error string.
nlohmann::json run_hf(const BenchTokenizerArgs& args, const std::string& tokenizer_file,
                      const std::string& corpus) {
  const std::string script = fmt::format(
      "import json,sys,time\n"
      "from tokenizers import Tokenizer\n"
      "tok=Tokenizer.from_file(sys.argv[1]); text=open(sys.argv[2],encoding='utf-8').read()\n"
      "n=len(tok.encode(text,add_special_tokens=False).ids)\n"
      "times=[]\n"
      "for _ in range({}):\n"
      "  t=time.perf_counter(); tok.encode(text,add_special_tokens=False); "
      "times.append(time.perf_counter()-t)\n"
      "times.sort(); mb=len(text.encode('utf-8'))/1e6\n"
      "print(json.dumps({{'mb_s': mb/times[len(times)//2], 'num_tokens': n, "
      "'version': __import__('tokenizers').__version__}}))\n",
      args.reps);
  const std::string script_path =
      (std::filesystem::temp_directory_path() / "moeserve_bench_tokenizer_hf.py").string();
  std::ofstream(script_path) << script;
  const std::string cmd =
      fmt::format("{} {} '{}' '{}' 2>&1", args.python, script_path, tokenizer_file, corpus);
  std::string output;
  if (FILE* pipe = popen(cmd.c_str(), "r")) {
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof(buf), pipe)) output.append(buf, n);
    pclose(pipe);
  }
  std::filesystem::remove(script_path);
  const size_t brace = output.rfind('{');
  nlohmann::json result = brace == std::string::npos
                              ? nlohmann::json()
                              : nlohmann::json::parse(output.substr(brace), nullptr, false);
  if (result.is_discarded() || !result.is_object()) {
    return {{"error", "HF tokenizers did not run (pip install tokenizers?): " + output}};
  }
  return result;
}

int run_bench(const BenchTokenizerArgs& args) {
  const std::string model = args.model.empty() ? tokenizer::default_tokenizer_dir() : args.model;
  std::string tokenizer_file = model;
  std::error_code ec;
  if (std::filesystem::is_directory(model, ec)) tokenizer_file = model + "/tokenizer.json";
  const std::string corpus_path = find_corpus(args.corpus);
  std::ifstream in(corpus_path, std::ios::binary);
  if (!in) {
    std::cerr << "error: cannot open corpus " << corpus_path << "\n";
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const double mb = static_cast<double>(text.size()) / 1e6;

  using Clock = std::chrono::steady_clock;
  auto load_start = Clock::now();
  auto tok = tokenizer::Tokenizer::load(tokenizer_file);
  if (!tok) {
    std::cerr << "error: " << tok.error().to_string() << "\n";
    return 1;
  }
  const double load_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - load_start).count();
  auto t0 = Clock::now();
  const size_t num_tokens = (*tok)->encode(text).size();
  const double cold_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> times;
  for (int i = 0; i < std::max(1, args.reps); ++i) {
    auto t = Clock::now();
    const auto ids = (*tok)->encode(text);
    times.push_back(std::chrono::duration<double>(Clock::now() - t).count());
  }
  std::sort(times.begin(), times.end());
  const double cpp_mb_s = mb / times[times.size() / 2];
  const double cpp_cold_mb_s = mb / cold_s;

  const nlohmann::json hf = run_hf(args, tokenizer_file, corpus_path);
  bench::BenchResult result;
  result.benchmark = "tokenizer";
  result.config = {
      {"tokenizer", tokenizer_file}, {"corpus", corpus_path}, {"corpus_bytes", text.size()},
      {"reps", args.reps},           {"threads", 1},          {"add_special_tokens", false}};
  result.results = {{"moeserve_mb_s", cpp_mb_s},
                    {"moeserve_cold_mb_s", cpp_cold_mb_s},
                    {"moeserve_load_ms", load_ms},
                    {"num_tokens", num_tokens},
                    {"hf", hf}};
  std::cout << fmt::format("corpus {} ({:.2f} MB), {} tokens\n", corpus_path, mb, num_tokens);
  std::cout << fmt::format("moeserve : {:8.2f} MB/s (cold cache {:.2f} MB/s, load {:.0f} ms)\n",
                           cpp_mb_s, cpp_cold_mb_s, load_ms);
  if (hf.contains("mb_s")) {
    const double hf_mb_s = hf["mb_s"].get<double>();
    result.results["hf_mb_s"] = hf_mb_s;
    result.results["ratio"] = cpp_mb_s / hf_mb_s;
    result.results["token_counts_match"] = hf.value("num_tokens", size_t{0}) == num_tokens;
    std::cout << fmt::format("HF tokenizers {}: {:8.2f} MB/s\nratio    : {:8.2f}x (goal >= 1x)\n",
                             hf.value("version", std::string("?")), hf_mb_s, cpp_mb_s / hf_mb_s);
  } else {
    std::cout << hf.value("error", std::string("HF side failed")) << "\n";
  }
  result.roofline_note =
      "not meaningful: BPE encoding is branchy, cache-bound CPU work with no bandwidth or FLOP "
      "bound worth comparing against";
  if (auto st = result.write(args.out); !st) {
    std::cerr << "error: " << st.error().to_string() << "\n";
    return 1;
  }
  std::cout << "wrote " << args.out << "\n";
  return 0;
}

}  // namespace

void register_bench_tokenizer(CLI::App& bench) {
  auto args = std::make_shared<BenchTokenizerArgs>();
  CLI::App* cmd = bench.add_subcommand("tokenizer", "Encode throughput vs HF tokenizers");
  cmd->add_option("--model", args->model, "Model folder or tokenizer.json (default: bundled)");
  cmd->add_option("--corpus", args->corpus,
                  "Text file (default: ../shared/data/tinyshakespeare.txt)");
  cmd->add_option("--out", args->out, "Result JSON path")->capture_default_str();
  cmd->add_option("--reps", args->reps, "Timed repetitions (median is reported)")
      ->capture_default_str();
  cmd->add_option("--python", args->python, "Python with `tokenizers` installed")
      ->capture_default_str();
  cmd->callback([args] { exit_code() = run_bench(*args); });
}

}  // namespace moeserve::app
