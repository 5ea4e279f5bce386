#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/logging.h"

namespace moeserve {

using nlohmann::json;

namespace {

// safetensors' own cap on the header (100 MB); a V4.1 shard header is a few hundred KB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr size_t kPageBytes = 4096;

// The safetensors dtypes moeserve reads (FP4_E2M1 is ours, not a safetensors dtype).
std::optional<DType> safetensors_dtype(std::string_view name) {
  if (name == "FP4_E2M1") return std::nullopt;
  return dtype_from_name(name);
}

std::string errno_text() { return std::strerror(errno); }

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  return fmt::format("{:.{}f} {}", bytes, u == 0 ? 0 : 1, units[u]);
}

}  // namespace

// ---- MappedFile -------------------------------------------------------------------------------

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(ErrorCode::kIo, "{}: cannot open: {}", path.string(), errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    return make_error(ErrorCode::kIo, "{}: cannot stat: {}", path.string(), why);
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const std::string why = errno_text();
      ::close(fd);
      return make_error(ErrorCode::kIo, "{}: cannot mmap {} bytes: {}", path.string(), file->size_,
                        why);
    }
    file->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return file;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

size_t MappedFile::prefetch(size_t offset, size_t length,
                            const std::function<void(size_t)>& on_bytes) const {
  if (data_ == nullptr || offset >= size_) return 0;
  length = std::min(length, size_ - offset);
  constexpr size_t kChunk = 64ull << 20;
  volatile uint8_t sink = 0;
  size_t done = 0;
  while (done < length) {
    const size_t n = std::min(kChunk, length - done);
    const size_t begin = offset + done;
    const size_t aligned = begin & ~(kPageBytes - 1);
    ::madvise(const_cast<uint8_t*>(data_ + aligned), n + (begin - aligned), MADV_WILLNEED);
    uint8_t acc = 0;
    for (size_t i = 0; i < n; i += kPageBytes) acc ^= data_[begin + i];
    sink = sink ^ acc;
    done += n;
    if (on_bytes) on_bytes(n);
  }
  (void)sink;
  return done;
}

// ---- header parsing ---------------------------------------------------------------------------

Result<ParsedSafetensorsHeader> parse_safetensors_header(std::span<const uint8_t> file_bytes,
                                                         std::string_view file_name) {
  const size_t file_size = file_bytes.size();
  if (file_size < 8)
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: truncated header: the file has {} bytes, fewer than the 8-byte header "
                      "length",
                      file_name, file_size);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file_bytes[static_cast<size_t>(i)];
  if (header_len > kMaxHeaderBytes)
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: header length {} exceeds the {}-byte limit (not a safetensors file?)",
                      file_name, header_len, kMaxHeaderBytes);
  if (header_len > file_size - 8)
    return make_error(ErrorCode::kOutOfRange,
                      "{}: header length {} runs past the end of the file ({} bytes)", file_name,
                      header_len, file_size);
  const auto* text = reinterpret_cast<const char*>(file_bytes.data() + 8);

  // Parse, rejecting duplicate top-level keys (nlohmann would silently keep the last one).
  std::string duplicate;
  std::set<std::string> keys;
  json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1) {
      const std::string key = parsed.get<std::string>();
      if (!keys.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json header = json::parse(text, text + header_len, on_event, /*allow_exceptions=*/false);
  if (header.is_discarded())
    return make_error(ErrorCode::kInvalidArgument, "{}: the {}-byte header is not valid JSON",
                      file_name, header_len);
  if (!header.is_object())
    return make_error(ErrorCode::kInvalidArgument, "{}: the header is not a JSON object",
                      file_name);
  if (!duplicate.empty())
    return make_error(ErrorCode::kInvalidArgument, "{}: tensor '{}': duplicate name in the header",
                      file_name, duplicate);

  ParsedSafetensorsHeader out;
  out.data_offset = 8 + static_cast<size_t>(header_len);
  const size_t data_size = file_size - out.data_offset;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object())
        return make_error(ErrorCode::kInvalidArgument, "{}: __metadata__ is not an object",
                          file_name);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          return make_error(ErrorCode::kInvalidArgument,
                            "{}: __metadata__.{}: expected a string value, got {}", file_name,
                            m.key(), m.value().dump());
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](std::string_view what) {
      return make_error(ErrorCode::kInvalidArgument, "{}: tensor '{}': {}", file_name, name, what);
    };
    if (!v.is_object()) return bad("expected an object {dtype, shape, data_offsets}");
    if (!v.contains("dtype") || !v["dtype"].is_string()) return bad("missing string 'dtype'");
    const std::string dtype_text = v["dtype"].get<std::string>();
    const std::optional<DType> dtype = safetensors_dtype(dtype_text);
    if (!dtype)
      return make_error(ErrorCode::kUnimplemented, "{}: tensor '{}': unknown dtype \"{}\"",
                        file_name, name, dtype_text);
    if (!v.contains("shape") || !v["shape"].is_array()) return bad("missing list 'shape'");
    const json& shape_json = v["shape"];
    if (shape_json.size() > static_cast<size_t>(kMaxDims))
      return bad(fmt::format("rank {} exceeds the supported {}", shape_json.size(), kMaxDims));
    std::vector<int64_t> dims;
    unsigned __int128 numel = 1;
    for (const json& d : shape_json) {
      if (!d.is_number_unsigned()) return bad(fmt::format("bad shape {}", shape_json.dump()));
      dims.push_back(d.get<int64_t>());
      numel *= d.get<uint64_t>();
      if (numel > (static_cast<unsigned __int128>(1) << 62))
        return bad(fmt::format("shape {} is too large", shape_json.dump()));
    }
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2 || !v["data_offsets"][0].is_number_unsigned() ||
        !v["data_offsets"][1].is_number_unsigned())
      return bad("'data_offsets' must be [begin, end] (non-negative integers)");
    const uint64_t begin = v["data_offsets"][0].get<uint64_t>();
    const uint64_t end = v["data_offsets"][1].get<uint64_t>();
    if (begin > end || end > data_size)
      return make_error(ErrorCode::kOutOfRange,
                        "{}: tensor '{}': data_offsets [{}, {}] out of range (data section has {} "
                        "bytes)",
                        file_name, name, begin, end, data_size);
    SafetensorsEntry e;
    e.name = name;
    e.dtype = *dtype;
    e.shape = Shape(std::span<const int64_t>(dims));
    e.nbytes = static_cast<size_t>(end - begin);
    e.offset = out.data_offset + static_cast<size_t>(begin);
    const size_t expected = dtype_bytes(*dtype, static_cast<int64_t>(numel));
    if (expected != e.nbytes)
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: tensor '{}': shape {} × {} needs {} bytes but data_offsets [{}, {}] "
                        "hold {}",
                        file_name, name, e.shape.to_string(), dtype_text, expected, begin, end,
                        e.nbytes);
    out.entries.push_back(std::move(e));
  }
  // Overlaps: sort by offset and compare neighbours (zero-byte tensors overlap nothing).
  std::vector<const SafetensorsEntry*> order;
  for (const auto& e : out.entries)
    if (e.nbytes > 0) order.push_back(&e);
  std::sort(order.begin(), order.end(),
            [](const auto* a, const auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    if (order[i]->offset < order[i - 1]->offset + order[i - 1]->nbytes)
      return make_error(
          ErrorCode::kInvalidArgument,
          "{}: tensors '{}' and '{}' overlap (bytes [{}, {}) and [{}, {}) of the data "
          "section)",
          file_name, order[i - 1]->name, order[i]->name, order[i - 1]->offset - out.data_offset,
          order[i - 1]->offset - out.data_offset + order[i - 1]->nbytes,
          order[i]->offset - out.data_offset,
          order[i]->offset - out.data_offset + order[i]->nbytes);
  }
  return out;
}

// ---- SafetensorsFile --------------------------------------------------------------------------

Result<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  MS_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> file, MappedFile::open(path));
  MS_ASSIGN_OR_RETURN(ParsedSafetensorsHeader header,
                      parse_safetensors_header({file->data(), file->size()}, path.string()));
  SafetensorsFile out;
  out.file_ = std::move(file);
  out.data_offset_ = header.data_offset;
  out.entries_ = std::move(header.entries);
  out.metadata_ = std::move(header.metadata);
  for (size_t i = 0; i < out.entries_.size(); ++i) out.by_name_[out.entries_[i].name] = i;
  return out;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

TensorView SafetensorsFile::view(const SafetensorsEntry& entry) const {
  // NOTE: the mapping is PROT_READ; TensorView has no const flavour, so views must not be written.
  return TensorView(const_cast<uint8_t*>(file_->data() + entry.offset), entry.dtype, entry.shape);
}

std::span<const uint8_t> SafetensorsFile::bytes(const SafetensorsEntry& entry) const {
  return {file_->data() + entry.offset, entry.nbytes};
}

// ---- writer -----------------------------------------------------------------------------------

Status write_safetensors(const std::filesystem::path& path, std::span<const TensorToWrite> tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorToWrite*> order;
  std::set<std::string> names;
  for (const TensorToWrite& t : tensors) {
    if (t.dtype == DType::kFp4E2m1)
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: tensor '{}': FP4_E2M1 is not a safetensors dtype (store packed FP4 as "
                        "I8)",
                        path.string(), t.name);
    if (t.name == "__metadata__" || !names.insert(t.name).second)
      return make_error(ErrorCode::kInvalidArgument, "{}: tensor '{}': duplicate or reserved name",
                        path.string(), t.name);
    const size_t expected = dtype_bytes(t.dtype, t.shape.numel());
    if (t.data.size() != expected)
      return make_error(ErrorCode::kInvalidArgument,
                        "{}: tensor '{}': shape {} × {} needs {} bytes, got {}", path.string(),
                        t.name, t.shape.to_string(), dtype_name(t.dtype), expected, t.data.size());
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const TensorToWrite* a, const TensorToWrite* b) {
    const int ba = dtype_bits(a->dtype), bb = dtype_bits(b->dtype);
    return ba != bb ? ba > bb : a->name < b->name;
  });
  json header = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  size_t offset = 0;
  for (const TensorToWrite* t : order) {
    json shape = json::array();
    for (int64_t d : t->shape.dims()) shape.push_back(d);
    header[t->name] = {{"dtype", std::string(dtype_name(t->dtype))},
                       {"shape", shape},
                       {"data_offsets", {offset, offset + t->data.size()}}};
    offset += t->data.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return make_error(ErrorCode::kIo, "{}: cannot open for writing", path.string());
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(text.size() >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const TensorToWrite* t : order)
    out.write(reinterpret_cast<const char*>(t->data.data()),
              static_cast<std::streamsize>(t->data.size()));
  out.close();
  if (!out) return make_error(ErrorCode::kIo, "{}: write failed", path.string());
  return ok_status();
}

// ---- progress ---------------------------------------------------------------------------------

LoadProgressCallback make_console_progress(double log_interval_s) {
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  auto last_log = std::make_shared<double>(-1e30);
  return [tty, log_interval_s, last_log](const LoadProgress& p) {
    const double rate = p.elapsed_s > 0 ? static_cast<double>(p.bytes_done) / p.elapsed_s : 0;
    const double eta =
        rate > 0 ? static_cast<double>(p.bytes_total - std::min(p.bytes_done, p.bytes_total)) / rate
                 : 0;
    const std::string line = fmt::format(
        "loading checkpoint: {} / {} ({:.1f}%), {} shards of {}, {}/s, {} {:.0f}s",
        format_bytes(static_cast<double>(p.bytes_done)),
        format_bytes(static_cast<double>(p.bytes_total)),
        p.bytes_total
            ? 100.0 * static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total)
            : 100.0,
        p.files_done, p.files_total, format_bytes(rate), p.finished ? "took" : "ETA",
        p.finished ? p.elapsed_s : eta);
    if (tty) {
      std::fprintf(stderr, "\r%s\033[K%s", line.c_str(), p.finished ? "\n" : "");
      std::fflush(stderr);
    } else if (p.finished || p.elapsed_s - *last_log >= log_interval_s) {
      *last_log = p.elapsed_s;
      MS_LOG_INFO("{}", line);
    }
  };
}

// ---- Checkpoint -------------------------------------------------------------------------------

const Checkpoint::Tensor* Checkpoint::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

std::vector<std::filesystem::path> Checkpoint::shard_paths() const {
  std::vector<std::filesystem::path> out;
  for (const auto& s : shards_) out.push_back(s.path());
  return out;
}

size_t Checkpoint::total_bytes() const {
  size_t n = 0;
  for (const auto& t : tensors_) n += t.nbytes;
  return n;
}

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";

struct ShardPlan {
  std::vector<std::filesystem::path> shards;
  // name -> shard index, from index.json (empty without an index)
  std::map<std::string, size_t> weight_map;
  std::map<std::string, std::string> metadata;
  std::string index_path;
};

Result<ShardPlan> read_index(const std::filesystem::path& index_path) {
  std::ifstream in(index_path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kIo, "{}: cannot open", index_path.string());
  json index = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object())
    return make_error(ErrorCode::kInvalidArgument, "{}: not a JSON object", index_path.string());
  if (!index.contains("weight_map") || !index["weight_map"].is_object())
    return make_error(ErrorCode::kInvalidArgument, "{}: missing object 'weight_map'",
                      index_path.string());
  ShardPlan plan;
  plan.index_path = index_path.string();
  const std::filesystem::path dir = index_path.parent_path();
  std::map<std::string, size_t> shard_ids;
  std::vector<std::string> missing;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      return make_error(ErrorCode::kInvalidArgument, "{}: weight_map.{}: expected a file name",
                        index_path.string(), it.key());
    const std::string shard = it.value().get<std::string>();
    auto [pos, inserted] = shard_ids.emplace(shard, plan.shards.size());
    if (inserted) {
      plan.shards.push_back(dir / shard);
      std::error_code ec;
      if (!std::filesystem::is_regular_file(dir / shard, ec))
        missing.push_back(fmt::format("'{}' (holds '{}')", shard, it.key()));
    }
    plan.weight_map[it.key()] = pos->second;
  }
  if (!missing.empty()) {
    std::string list;
    for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
    return make_error(ErrorCode::kNotFound, "{}: weight_map names {} missing shard{}: {}",
                      index_path.string(), missing.size(), missing.size() == 1 ? "" : "s", list);
  }
  if (index.contains("metadata") && index["metadata"].is_object()) {
    for (auto m = index["metadata"].begin(); m != index["metadata"].end(); ++m)
      plan.metadata[m.key()] =
          m.value().is_string() ? m.value().get<std::string>() : m.value().dump();
  }
  return plan;
}

Result<ShardPlan> plan_shards(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    if (std::filesystem::is_regular_file(path / kIndexName, ec))
      return read_index(path / kIndexName);
    ShardPlan plan;
    if (std::filesystem::is_regular_file(path / "model.safetensors", ec)) {
      plan.shards.push_back(path / "model.safetensors");
      return plan;
    }
    for (const auto& e : std::filesystem::directory_iterator(path, ec))
      if (e.path().extension() == ".safetensors") plan.shards.push_back(e.path());
    std::sort(plan.shards.begin(), plan.shards.end());
    if (plan.shards.empty())
      return make_error(ErrorCode::kNotFound, "{}: no {} and no *.safetensors files", path.string(),
                        kIndexName);
    return plan;
  }
  if (path.extension() == ".json") return read_index(path);
  if (!std::filesystem::exists(path, ec))
    return make_error(ErrorCode::kNotFound, "{}: no such file or directory", path.string());
  ShardPlan plan;
  plan.shards.push_back(path);
  return plan;
}

}  // namespace

Result<Checkpoint> CheckpointLoader::load(const std::filesystem::path& path) const {
  MS_ASSIGN_OR_RETURN(ShardPlan plan, plan_shards(path));
  const size_t n = plan.shards.size();
  LoadProgress progress;
  progress.files_total = static_cast<int32_t>(n);
  for (const auto& p : plan.shards) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(p, ec);
    if (!ec) progress.bytes_total += static_cast<size_t>(size);
  }

  std::vector<std::optional<Result<SafetensorsFile>>> results(n);
  std::mutex mu;
  const auto start = std::chrono::steady_clock::now();
  double last_report = -1e30;
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // Called with mu held.
  auto report = [&](bool force) {
    if (!options_.progress) return;
    progress.elapsed_s = elapsed();
    if (!force && progress.elapsed_s - last_report < options_.progress_interval_s) return;
    last_report = progress.elapsed_s;
    options_.progress(progress);
  };
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto worker = [&] {
    for (size_t i = next++; i < n && !failed; i = next++) {
      Result<SafetensorsFile> file = SafetensorsFile::open(plan.shards[i]);
      if (!file) failed = true;
      if (file && options_.prefetch) {
        file->mapping()->prefetch(0, file->file_size(), [&](size_t bytes) {
          std::lock_guard<std::mutex> lock(mu);
          progress.bytes_done += bytes;
          report(false);
        });
      }
      std::lock_guard<std::mutex> lock(mu);
      if (file && !options_.prefetch) progress.bytes_done += file->file_size();
      ++progress.files_done;
      results[i] = std::move(file);
      report(false);
    }
  };
  const size_t threads = std::clamp<size_t>(static_cast<size_t>(std::max(options_.num_threads, 1)),
                                            1, std::max<size_t>(n, 1));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();

  Checkpoint ckpt;
  for (size_t i = 0; i < n; ++i) {
    if (!results[i]) continue;  // not reached after a failure
    if (!*results[i]) return tl::unexpected(results[i]->error());
  }
  for (size_t i = 0; i < n; ++i) ckpt.shards_.push_back(std::move(**results[i]));
  {
    std::lock_guard<std::mutex> lock(mu);
    progress.finished = true;
    report(true);
  }

  // One namespace: no name in two shards; with an index, every listed tensor is in its shard.
  std::map<std::string, std::pair<int32_t, const SafetensorsEntry*>> all;
  for (size_t s = 0; s < ckpt.shards_.size(); ++s) {
    for (const SafetensorsEntry& e : ckpt.shards_[s].entries()) {
      auto [it, inserted] = all.emplace(e.name, std::make_pair(static_cast<int32_t>(s), &e));
      if (!inserted)
        return make_error(ErrorCode::kInvalidArgument,
                          "tensor '{}' appears in two shards: {} and {}", e.name,
                          ckpt.shards_[static_cast<size_t>(it->second.first)].path().string(),
                          ckpt.shards_[s].path().string());
    }
  }
  if (!plan.index_path.empty()) {
    for (const auto& [name, shard] : plan.weight_map) {
      auto it = all.find(name);
      if (it == all.end() || static_cast<size_t>(it->second.first) != shard)
        return make_error(ErrorCode::kNotFound,
                          "{}: tensor '{}' is mapped to {} but not found there", plan.index_path,
                          name, plan.shards[shard].string());
    }
    for (const auto& [name, where] : all)
      if (plan.weight_map.count(name) == 0)
        MS_LOG_WARN("{}: tensor '{}' in {} is not listed in weight_map", plan.index_path, name,
                    ckpt.shards_[static_cast<size_t>(where.first)].path().string());
    ckpt.metadata_ = plan.metadata;
  } else if (ckpt.shards_.size() == 1) {
    ckpt.metadata_ = ckpt.shards_[0].metadata();
  }
  for (const auto& [name, where] : all) {
    Checkpoint::Tensor t;
    t.name = name;
    t.dtype = where.second->dtype;
    t.shape = where.second->shape;
    t.nbytes = where.second->nbytes;
    t.shard = where.first;
    t.view = ckpt.shards_[static_cast<size_t>(where.first)].view(*where.second);
    ckpt.by_name_[name] = ckpt.tensors_.size();
    ckpt.tensors_.push_back(std::move(t));
  }
  return ckpt;
}

}  // namespace moeserve
