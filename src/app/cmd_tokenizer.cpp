// `moeserve tokenize` / `moeserve detokenize`: run the tokenizer of a model folder (or the bundled
// assets/tokenizer) on the command line. `tokenize --jsonl-in/--jsonl-out` handles many strings
// in one process (the HF parity test drives it).
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "tokenizer/default_paths.h"
#include "tokenizer/engram_token_map.h"
#include "tokenizer/stream_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::app {
namespace {

struct TokenizeArgs {
  std::string model;
  std::string text;
  std::string jsonl_in;
  std::string jsonl_out;
  std::string engram_map_out;
  bool add_special_tokens = false;
  bool show_tokens = false;
};

struct DetokenizeArgs {
  std::string model;
  std::string ids;
  bool skip_special_tokens = false;
};

Result<std::unique_ptr<tokenizer::Tokenizer>> load_tokenizer(const std::string& model) {
  return tokenizer::Tokenizer::load(model.empty() ? tokenizer::default_tokenizer_dir() : model);
}

nlohmann::json ids_to_json(const std::vector<int32_t>& ids) { return nlohmann::json(ids); }

// One JSON object per line in, one per line out:
//   {"text": s[, "add_special_tokens": b]} → {"ids": [...], "text": decode, "text_skip_special":
//   decode(skip), "stream_ok": streaming decode == decode}
//   {"ids": [...]} → {"text": decode(ids), "text_skip_special": decode(ids, skip)}
int run_jsonl(const tokenizer::Tokenizer& tok, const TokenizeArgs& args) {
  std::ifstream in(args.jsonl_in);
  if (!in) {
    std::cerr << "error: cannot open " << args.jsonl_in << "\n";
    return 1;
  }
  std::ofstream out(args.jsonl_out);
  if (!out) {
    std::cerr << "error: cannot write " << args.jsonl_out << "\n";
    return 1;
  }
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    nlohmann::json req = nlohmann::json::parse(line, nullptr, false);
    if (req.is_discarded() || !req.is_object()) {
      std::cerr << "error: " << args.jsonl_in << ":" << line_no << ": not a JSON object\n";
      return 1;
    }
    nlohmann::json resp = nlohmann::json::object();
    std::vector<int32_t> ids;
    if (req.contains("text") && req["text"].is_string()) {
      ids = tok.encode(req["text"].get<std::string>(), req.value("add_special_tokens", false));
      resp["ids"] = ids_to_json(ids);
      tokenizer::StreamDetokenizer stream(tok);
      std::string streamed;
      for (int32_t id : ids) streamed += stream.push(id);
      streamed += stream.finish();
      resp["stream_ok"] = streamed == tok.decode(ids);
    } else if (req.contains("ids") && req["ids"].is_array()) {
      ids = req["ids"].get<std::vector<int32_t>>();
    } else {
      std::cerr << "error: " << args.jsonl_in << ":" << line_no << ": needs \"text\" or \"ids\"\n";
      return 1;
    }
    resp["text"] = tok.decode(ids);
    resp["text_skip_special"] = tok.decode(ids, /*skip_special_tokens=*/true);
    out << resp.dump() << "\n";
  }
  return 0;
}

int run_tokenize(const TokenizeArgs& args) {
  auto tok = load_tokenizer(args.model);
  if (!tok) {
    std::cerr << "error: " << tok.error().to_string() << "\n";
    return 1;
  }
  if (!args.engram_map_out.empty()) {
    const tokenizer::EngramTokenMap map = tokenizer::build_engram_token_map(**tok);
    std::ofstream out(args.engram_map_out);
    out << nlohmann::json{{"num_compressed", map.num_compressed}, {"map", map.compressed}}.dump()
        << "\n";
    return out ? 0 : 1;
  }
  if (!args.jsonl_in.empty() || !args.jsonl_out.empty()) {
    if (args.jsonl_in.empty() || args.jsonl_out.empty()) {
      std::cerr << "error: --jsonl-in and --jsonl-out go together\n";
      return 2;
    }
    return run_jsonl(**tok, args);
  }
  const std::vector<int32_t> ids = (*tok)->encode(args.text, args.add_special_tokens);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) line += ",";
    line += std::to_string(ids[i]);
  }
  std::cout << line << "\n";
  if (args.show_tokens) {
    for (int32_t id : ids) {
      std::cout << id << "\t" << nlohmann::json((*tok)->decode(std::vector<int32_t>{id})).dump()
                << "\t" << (*tok)->id_to_token(id).value_or("") << "\n";
    }
  }
  return 0;
}

int run_detokenize(const DetokenizeArgs& args) {
  auto tok = load_tokenizer(args.model);
  if (!tok) {
    std::cerr << "error: " << tok.error().to_string() << "\n";
    return 1;
  }
  std::vector<int32_t> ids;
  std::stringstream ss(args.ids);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.find_first_not_of(" \t") == std::string::npos) continue;
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (item.find_first_not_of(" \t", used) != std::string::npos || v < 0 || v > INT32_MAX) {
        throw std::invalid_argument(item);
      }
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      std::cerr << "error: \"" << item << "\" is not a token id\n";
      return 2;
    }
  }
  std::cout << (*tok)->decode(ids, args.skip_special_tokens) << "\n";
  return 0;
}

}  // namespace

void register_tokenizer_commands(CLI::App& app) {
  auto tok_args = std::make_shared<TokenizeArgs>();
  CLI::App* tokenize = app.add_subcommand("tokenize", "Encode text to token ids");
  tokenize->add_option("--model", tok_args->model,
                       "Model folder or tokenizer.json (default: assets/tokenizer, see docs)");
  tokenize->add_option("text", tok_args->text, "Text to encode");
  tokenize->add_flag("--add-special-tokens", tok_args->add_special_tokens,
                     "Apply the post-processor template (e.g. a leading BOS)");
  tokenize->add_flag("--tokens", tok_args->show_tokens, "Also print one line per token");
  tokenize->add_option("--jsonl-in", tok_args->jsonl_in, "Batch mode: JSON lines to process")
      ->group("");
  tokenize->add_option("--jsonl-out", tok_args->jsonl_out, "Batch mode: where results go")
      ->group("");
  tokenize
      ->add_option("--engram-map-out", tok_args->engram_map_out,
                   "Write the Engram compressed token map as JSON")
      ->group("");
  tokenize->callback([tok_args] { exit_code() = run_tokenize(*tok_args); });

  auto detok_args = std::make_shared<DetokenizeArgs>();
  CLI::App* detokenize = app.add_subcommand("detokenize", "Decode comma-separated token ids");
  detokenize->add_option("--model", detok_args->model,
                         "Model folder or tokenizer.json (default: assets/tokenizer, see docs)");
  detokenize->add_option("ids", detok_args->ids, "Token ids, e.g. 1,2,3")->required();
  detokenize->add_flag("--skip-special-tokens", detok_args->skip_special_tokens,
                       "Drop special tokens from the output");
  detokenize->callback([detok_args] { exit_code() = run_detokenize(*detok_args); });
}

}  // namespace moeserve::app
