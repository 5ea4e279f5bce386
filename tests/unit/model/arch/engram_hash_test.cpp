// Engram hash ids (model.md §4 steps 2–5) on the full-size config against values computed by hand
// (Python integers) from the spec's constants: layer 1 multipliers
// [76632096046245, 4839876093313, 35959672319349, 73987337458391], 2-gram primes 16000057 ...
// 16000183, then the next primes for 3/4-grams (sum 384006168, the spec's engram_num_embeddings),
// offsets = exclusive prefix sums; pad' = map[2]. Plus DEAD/blocked shifts and incremental
// history.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/engram_table.h"

namespace moeserve {
namespace {

constexpr int64_t kM[4] = {76632096046245, 4839876093313, 35959672319349, 73987337458391};
const std::vector<std::vector<int64_t>> kPrimes = {
    {16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133, 16000183},
    {16000189, 16000207, 16000211, 16000253, 16000277, 16000289, 16000307, 16000321},
    {16000339, 16000381, 16000393, 16000399, 16000403, 16000409, 16000447, 16000463}};

struct Fixture {
  ModelConfig config;
  EngramTokenMap map;
  const EngramLayer* layer1 = nullptr;
};

Fixture make() {
  Fixture f;
  auto c = load_model_config(std::string(MOESERVE_SOURCE_DIR) + "/configs/deepseek-v4.1-flash");
  if (!c) throw std::runtime_error(c.error().to_string());
  f.config = *c;
  // A stand-in compressed map: token x -> x mod compressed vocab (so pad' = map[2] = 2).
  std::vector<int32_t> table(static_cast<size_t>(f.config.vocab_size));
  for (size_t i = 0; i < table.size(); ++i)
    table[i] = static_cast<int32_t>(i % static_cast<size_t>(f.config.engram_compressed_vocab_size));
  auto m = EngramTokenMap::from_table(f.config, std::move(table));
  if (!m) throw std::runtime_error(m.error().to_string());
  f.map = std::move(*m);
  f.layer1 = f.config.engram_for_layer(1);
  return f;
}

// A request's history before its first token (what SequenceState starts with).
EngramHistory fresh(const ModelConfig& c) {
  EngramHistory h;
  h.last_ids.assign(static_cast<size_t>(c.engram_max_ngram_size - 1), -1);
  return h;
}

std::vector<int64_t> ids_of(const Fixture& f, const EngramHistory& h, std::vector<int32_t> tokens,
                            std::vector<uint8_t> image = {}) {
  std::vector<int64_t> out(tokens.size() * static_cast<size_t>(f.config.engram_num_hashes()));
  compute_engram_ids(f.config, *f.layer1, f.map, h, tokens, image, out);
  return out;
}

std::vector<int64_t> row(const std::vector<int64_t>& ids, size_t pos) {
  return {ids.begin() + static_cast<std::ptrdiff_t>(pos * 24),
          ids.begin() + static_cast<std::ptrdiff_t>((pos + 1) * 24)};
}

TEST(EngramHash, FullSizeLayer1ParametersAreTheSpecConstants) {
  const Fixture f = make();
  ASSERT_NE(f.layer1, nullptr);
  EXPECT_EQ(f.config.engram_num_hashes(), 24);
  EXPECT_EQ(f.layer1->multipliers, std::vector<int64_t>(std::begin(kM), std::end(kM)));
  EXPECT_EQ(f.layer1->primes, kPrimes);
  EXPECT_EQ(f.layer1->num_embeddings, 384006168);
  EXPECT_EQ(f.layer1->offsets[1], 16000057);
  EXPECT_EQ(f.layer1->offsets[8], 128000880);
}

TEST(EngramHash, HandComputedIds) {
  const Fixture f = make();
  const auto ids = ids_of(f, fresh(f.config), {1000, 2000, 3000, 4000});
  // Position 3: tok = (4000, 3000, 2000, 1000); h = 4000*m0 ^ 3000*m1 (^ 2000*m2 ^ 1000*m3).
  EXPECT_EQ(row(ids, 3), (std::vector<int64_t>{
                             15465977,  28790835,  32971381,  50776212,  70685234,  88308810,
                             97180690,  115458442, 130437439, 147954272, 164404239, 187601822,
                             193743686, 213368287, 235496802, 240837074, 261497777, 281534125,
                             295127654, 310093209, 325466156, 340619041, 353861828, 370049875}));
  // Position 0: shifts 1..3 are before the sequence start -> pad' = 2.
  EXPECT_EQ(row(ids, 0), (std::vector<int64_t>{
                             3617660,   30972310,  34928021,  50659852,  66544974,  82583410,
                             106617133, 127844743, 143733824, 146344198, 171839816, 184118349,
                             193894188, 222911751, 226598905, 252712254, 264290285, 278615776,
                             294331813, 310222398, 331495046, 347421603, 358121881, 379728765}));
  // The 2-gram of position 3 directly from the formula.
  const int64_t h = (4000 * kM[0]) ^ (3000 * kM[1]);
  for (int k = 0; k < 8; ++k) {
    const int64_t off = std::accumulate(kPrimes[0].begin(), kPrimes[0].begin() + k, int64_t{0});
    EXPECT_EQ(row(ids, 3)[static_cast<size_t>(k)], h % kPrimes[0][static_cast<size_t>(k)] + off);
  }
}

TEST(EngramHash, DeadTokenBlocksItsShiftAndAllLargerOnes) {
  const Fixture f = make();
  const auto ids = ids_of(f, fresh(f.config), {1000, 2000, 3000, 4000}, {0, 1, 0, 0});
  // Position 3: tok = (4000, 3000, pad', pad'): the 2-gram is unchanged, 3/4-grams blocked.
  EXPECT_EQ(row(ids, 3), (std::vector<int64_t>{
                             15465977,  28790835,  32971381,  50776212,  70685234,  88308810,
                             97180690,  115458442, 143104226, 154067381, 161947228, 191104041,
                             193748208, 219611631, 235082502, 242342918, 258721394, 275326214,
                             299167618, 311223494, 324644275, 336850341, 362913351, 370757950}));
  // Position 2: the DEAD token at shift 1 blocks shifts 1..3.
  EXPECT_EQ(row(ids, 2), (std::vector<int64_t>{
                             9785197,   20578235,  34693502,  51873808,  78506443,  87613900,
                             100210801, 124095733, 132414663, 151555194, 166554458, 181779347,
                             194187106, 208778964, 231151563, 254288129, 264145882, 274692776,
                             296573736, 307611122, 325672204, 336817262, 366235074, 376028222}));
}

TEST(EngramHash, HistoryMakesChunkedIdsEqualOneShot) {
  const Fixture f = make();
  const std::vector<int32_t> tokens = {7, 99091, 99092, 129279, 5, 2, 64000, 17, 3};
  const std::vector<uint8_t> image = {0, 0, 0, 1, 0, 0, 0, 1, 1};
  const auto whole = ids_of(f, fresh(f.config), tokens, image);
  for (size_t split : {1u, 2u, 4u, 5u, 8u}) {
    EngramHistory h = fresh(f.config);
    std::vector<int32_t> a(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(split));
    std::vector<uint8_t> ia(image.begin(), image.begin() + static_cast<std::ptrdiff_t>(split));
    std::vector<int32_t> b(tokens.begin() + static_cast<std::ptrdiff_t>(split), tokens.end());
    std::vector<uint8_t> ib(image.begin() + static_cast<std::ptrdiff_t>(split), image.end());
    auto ids = ids_of(f, h, a, ia);
    advance_engram_history(f.config, f.map, a, ia, h);
    EXPECT_EQ(h.num_tokens, static_cast<int64_t>(split));
    const auto rest = ids_of(f, h, b, ib);
    ids.insert(ids.end(), rest.begin(), rest.end());
    EXPECT_EQ(ids, whole) << "split at " << split;
  }
  // Every id lies in the layer's table.
  for (int64_t id : whole) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, f.layer1->num_embeddings);
  }
}

}  // namespace
}  // namespace moeserve
