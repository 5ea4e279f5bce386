// safetensors reading (mmap, zero-copy TensorViews into the mapping) and writing, single files and
// sharded checkpoints (model.safetensors.index.json). Invariant: every tensor a SafetensorsFile or
// Checkpoint hands out lies inside its mapping, has a known dtype, a byte range equal to
// shape × dtype, and does not overlap another tensor. Views are read-only (PROT_READ mapping) and
// live as long as the SafetensorsFile / Checkpoint that owns the mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/result.h"
#include "tensor/tensor.h"

namespace moeserve {

// A read-only memory mapping of one whole file (munmap on destruction).
class MappedFile final {
 public:
  [[nodiscard]] static Result<std::shared_ptr<MappedFile>> open(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  [[nodiscard]] const uint8_t* data() const { return data_; }
  [[nodiscard]] size_t size() const { return size_; }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  // madvise(WILLNEED) on [offset, offset + length) and touch one byte per page so the range is
  // resident; calls on_bytes(n) after each chunk it finished (progress). Returns bytes touched.
  size_t prefetch(size_t offset, size_t length, const std::function<void(size_t)>& on_bytes) const;

 private:
  MappedFile() = default;
  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// One tensor of a safetensors header. Offsets are absolute in the file.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  size_t offset = 0;  // absolute file offset of the first byte
  size_t nbytes = 0;
};

class SafetensorsFile final {
 public:
  // Maps `path` and validates the header (see the invariant above). Errors name the file and the
  // tensor: truncated header, header length past EOF, header not JSON, unknown dtype, offsets out
  // of range or overlapping, shape × dtype ≠ byte range, duplicate names.
  [[nodiscard]] static Result<SafetensorsFile> open(const std::filesystem::path& path);

  [[nodiscard]] const std::filesystem::path& path() const { return file_->path(); }
  [[nodiscard]] const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const { return metadata_; }
  [[nodiscard]] const SafetensorsEntry* find(std::string_view name) const;
  // A read-only view into the mapping (CPU device).
  [[nodiscard]] TensorView view(const SafetensorsEntry& entry) const;
  [[nodiscard]] std::span<const uint8_t> bytes(const SafetensorsEntry& entry) const;
  [[nodiscard]] size_t data_offset() const { return data_offset_; }
  [[nodiscard]] size_t file_size() const { return file_->size(); }
  [[nodiscard]] const std::shared_ptr<MappedFile>& mapping() const { return file_; }

 private:
  std::shared_ptr<MappedFile> file_;
  size_t data_offset_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::unordered_map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// Parses and validates a safetensors header held in memory (`file_bytes` = the whole file);
// `file_name` names the file in errors. Used by SafetensorsFile::open and by tests.
struct ParsedSafetensorsHeader {
  size_t data_offset = 0;
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
};
[[nodiscard]] Result<ParsedSafetensorsHeader> parse_safetensors_header(
    std::span<const uint8_t> file_bytes, std::string_view file_name);

// One tensor to write. `data` must hold exactly dtype_bytes(dtype, shape.numel()) bytes;
// kFp4E2m1 is refused (store packed FP4 as kI8, as the checkpoint does).
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  std::span<const uint8_t> data;
};

// Writes a safetensors file. Tensors are laid out by descending element size, then by name, so
// every tensor is aligned to its element size; the header is space-padded to a multiple of 8.
// Output depends only on the arguments (byte-identical across runs and machines).
[[nodiscard]] Status write_safetensors(const std::filesystem::path& path,
                                       std::span<const TensorToWrite> tensors,
                                       const std::map<std::string, std::string>& metadata = {});

// Progress of a CheckpointLoader run (all shards together).
struct LoadProgress {
  size_t bytes_done = 0;
  size_t bytes_total = 0;
  int32_t files_done = 0;
  int32_t files_total = 0;
  double elapsed_s = 0;
  bool finished = false;
};
using LoadProgressCallback = std::function<void(const LoadProgress&)>;

// A progress printer: on a TTY a carriage-return line on stderr ("12.3/45.6 GB 3.2 GB/s ETA 10s"),
// otherwise an info log line at most every `log_interval_s` seconds.
[[nodiscard]] LoadProgressCallback make_console_progress(double log_interval_s = 10.0);

struct CheckpointLoadOptions {
  int32_t num_threads = 8;        // shards opened/validated/prefetched in parallel (bounded)
  bool prefetch = true;           // madvise(WILLNEED) + touch every page of every shard
  LoadProgressCallback progress;  // may be empty
  double progress_interval_s =
      0.2;  // minimum time between progress callbacks (finish always fires)
};

// A checkpoint: one or many safetensors shards, one tensor namespace.
class Checkpoint final {
 public:
  struct Tensor {
    std::string name;
    DType dtype = DType::kF32;
    Shape shape;
    size_t nbytes = 0;
    int32_t shard = 0;  // index into shard_paths()
    TensorView view;    // read-only, into the shard's mapping
  };

  [[nodiscard]] const Tensor* find(std::string_view name) const;
  [[nodiscard]] const std::vector<Tensor>& tensors() const { return tensors_; }  // sorted by name
  [[nodiscard]] std::vector<std::filesystem::path> shard_paths() const;
  [[nodiscard]] size_t total_bytes() const;  // sum of tensor bytes
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  friend class CheckpointLoader;
  std::vector<SafetensorsFile> shards_;
  std::vector<Tensor> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;  // index.json "metadata" or the single file's
};

// Opens a checkpoint: a .safetensors file, a model.safetensors.index.json, or a directory holding
// either the index, model.safetensors, or *.safetensors shards. Shards are mapped, validated and
// (optionally) prefetched on a bounded thread pool with progress reports.
class CheckpointLoader final {
 public:
  explicit CheckpointLoader(CheckpointLoadOptions options = {}) : options_(std::move(options)) {}
  [[nodiscard]] Result<Checkpoint> load(const std::filesystem::path& path) const;

 private:
  CheckpointLoadOptions options_;
};

}  // namespace moeserve
