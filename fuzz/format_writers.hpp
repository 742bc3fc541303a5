// Byte-level writers for the formats that llmq only reads and has no writer of its own for:
// llama2.c tokenizer.bin and checkpoints, and sentencepiece's protobuf. Used by the seed
// generator (make_seeds.cpp) and by fuzz_token_file.cpp for its small fixed tokenizer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace llmq::fuzz {

// Little-endian scalars, as every format here stores them.
template <typename T>
void append_le(std::string* out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out->append(bytes, sizeof(T));
}

struct ScoredPiece {
  std::string text;
  float score = 0.0f;
};

// "<0x41>": sentencepiece's spelling of a byte-fallback piece.
inline std::string byte_piece(int byte) {
  static const char* kHex = "0123456789ABCDEF";
  return std::string("<0x") + kHex[(byte >> 4) & 15] + kHex[byte & 15] + ">";
}

// A small llama2.c-style vocabulary: <unk>, BOS, EOS, the 256 byte pieces, then `extra` pieces
// whose score rises with their length so longer merges win.
inline std::vector<ScoredPiece> small_vocabulary(const std::vector<std::string>& extra) {
  std::vector<ScoredPiece> pieces = {{"<unk>", 0.0f}, {"\n<s>\n", 0.0f}, {"\n</s>\n", 0.0f}};
  for (int b = 0; b < 256; ++b) pieces.push_back({byte_piece(b), 0.0f});
  for (const std::string& p : extra) pieces.push_back({p, static_cast<float>(p.size()) - 10.0f});
  return pieces;
}

// llama2.c tokenizer.bin: int32 max_token_length, then per piece float32 score, int32 length, bytes.
inline std::string llama2c_tokenizer_file(const std::vector<ScoredPiece>& pieces) {
  int32_t longest = 1;
  for (const ScoredPiece& p : pieces) longest = std::max(longest, static_cast<int32_t>(p.text.size()));
  std::string out;
  append_le(&out, longest);
  for (const ScoredPiece& p : pieces) {
    append_le(&out, p.score);
    append_le(&out, static_cast<int32_t>(p.text.size()));
    out += p.text;
  }
  return out;
}

// The fixed tokenizer fuzz_token_file encodes text with (and a seed of fuzz_tokenizer_llama2c).
inline std::string story_tokenizer_file() {
  return llama2c_tokenizer_file(small_vocabulary({" ", "e", "t", "h", "o", "n", "th", "he", "the", " the", " o",
                                                  "on", " once", "upon", " a", " time", "12", "\n"}));
}

// ---- protobuf wire format (sentencepiece tokenizer.model)

inline void append_varint(std::string* out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out->push_back(static_cast<char>(0x80 | (v & 0x7F)));
  out->push_back(static_cast<char>(v));
}
inline std::string pb_varint(uint32_t field, int64_t value) {
  std::string out;
  append_varint(&out, uint64_t{field} << 3);  // wire type 0
  append_varint(&out, static_cast<uint64_t>(value));
  return out;
}
inline std::string pb_bytes(uint32_t field, const std::string& payload) {
  std::string out;
  append_varint(&out, (uint64_t{field} << 3) | 2);
  append_varint(&out, payload.size());
  return out + payload;
}
inline std::string pb_float(uint32_t field, float value) {
  std::string out;
  append_varint(&out, (uint64_t{field} << 3) | 5);
  append_le(&out, value);
  return out;
}

// ---- llama2.c checkpoints

struct Llama2cShape {
  int32_t dim = 8, hidden_dim = 16, n_layers = 1, n_heads = 2, n_kv_heads = 1, vocab_size = 12, seq_len = 8;
  bool shared_classifier = true;
  bool v1 = false;  // "ak42" version 1 header, else the legacy 7-int header
};

// The float count after the header that llama2.c's export.py writes for `s`, or -1 where the
// shape is not one (non-positive sizes, heads not dividing dim) or the count overflows int64.
inline int64_t llama2c_float_count(const Llama2cShape& s) {
  if (s.dim <= 0 || s.hidden_dim <= 0 || s.n_layers <= 0 || s.n_heads <= 0 || s.n_kv_heads <= 0 ||
      s.vocab_size <= 0 || s.seq_len <= 0 || s.dim % s.n_heads != 0)
    return -1;
  // Header fields are any int32, so every step is checked (a corrupt header overflows int64).
  bool overflow = false;
  auto mul = [&overflow](int64_t a, int64_t b) {
    int64_t r = 0;
    overflow |= __builtin_mul_overflow(a, b, &r);
    return r;
  };
  auto add = [&overflow](int64_t a, int64_t b) {
    int64_t r = 0;
    overflow |= __builtin_add_overflow(a, b, &r);
    return r;
  };
  const int64_t dim = s.dim, head = dim / s.n_heads, kv_dim = mul(head, s.n_kv_heads);
  // Per layer: two norms, wq and wo, wk and wv, w1 w2 w3.
  const int64_t layer = add(add(mul(2, dim), mul(mul(2, dim), dim)),
                            add(mul(mul(2, kv_dim), dim), mul(mul(3, s.hidden_dim), dim)));
  int64_t total = add(mul(layer, s.n_layers), mul(mul(s.shared_classifier ? 1 : 2, s.vocab_size), dim));
  total = add(total, dim);                                  // final norm
  if (!s.v1) total = add(total, mul(s.seq_len, head));      // freq_cis_real and _imag, head/2 each
  return overflow ? -1 : total;
}

// A checkpoint of `shape` whose floats are small distinct values (weights need not be sensible
// for a parser). The float count follows llama2.c's export.py for both headers.
inline std::string llama2c_header(const Llama2cShape& s) {
  std::string out;
  const int32_t header[7] = {s.dim, s.hidden_dim, s.n_layers, s.n_heads, s.n_kv_heads,
                             s.v1 || s.shared_classifier ? s.vocab_size : -s.vocab_size, s.seq_len};
  if (s.v1) {
    append_le(&out, uint32_t{0x616b3432});  // "ak42"
    append_le(&out, int32_t{1});
  }
  for (int32_t v : header) append_le(&out, v);
  if (s.v1) {
    out.push_back(s.shared_classifier ? 1 : 0);
    out.resize(256, '\0');
  }
  return out;
}

inline std::string llama2c_checkpoint(const Llama2cShape& s) {
  std::string out = llama2c_header(s);
  const int64_t floats = llama2c_float_count(s);
  for (int64_t i = 0; i < floats; ++i) append_le(&out, static_cast<float>(i % 97) / 97.0f - 0.5f);
  return out;
}

}  // namespace llmq::fuzz
