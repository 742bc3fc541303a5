// The BPE tokenizer every tokenizer file becomes: special tokens first, then normalization,
// pre-tokenization into words, and per word the merge loop. Merging keeps the symbols in a linked
// list and the candidate pairs in a heap (stale entries are skipped when popped), so a long line
// with no pre-tokenizer (sentencepiece) costs O(n log n) rather than run.c's O(n^2) rescans, with
// the same result: the best pair first, the leftmost among equals.
#include <algorithm>
#include <queue>

#include "model/tokenizer/tokenizer_bpe.hpp"

namespace llmq::tokenizer_detail {
namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

void replace_all(std::string* s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t hit = s->find(from, pos);
    if (hit == std::string::npos) break;
    out.append(*s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
  }
  out.append(*s, pos, std::string::npos);
  *s = std::move(out);
}

// sentencepiece's remove_extra_whitespaces: no leading or trailing spaces, runs become one.
std::string collapse_spaces(const std::string& s) {
  std::string out;
  bool pending_space = false;
  for (char c : s) {
    if (c == ' ') {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out += ' ';
    pending_space = false;
    out += c;
  }
  return out;
}

std::string hex_code_point(uint32_t cp) {
  static const char* kDigits = "0123456789ABCDEF";
  std::string s;
  for (int shift = 20; shift >= 0; shift -= 4) {
    const uint32_t digit = (cp >> shift) & 0xF;
    if (!s.empty() || digit != 0 || shift <= 12) s += kDigits[digit];
  }
  return "U+" + s;
}

}  // namespace

int parse_byte_piece(const std::string& piece) {
  // Exactly "<0x" two upper- or lower-case hex digits ">", as sentencepiece writes byte pieces.
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = piece[i];
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

BpeTokenizer::BpeTokenizer(BpeSpec spec) : spec_(std::move(spec)) {
  vocab_size_ = static_cast<int64_t>(spec_.pieces.size());
  bos_ = spec_.bos;
  eos_ = spec_.eos;
  end_ids_ = spec_.end_ids;
  if (end_ids_.empty() && eos_ >= 0) end_ids_.push_back(eos_);
  description_ = spec_.description;
}

Status BpeTokenizer::create(BpeSpec spec, std::unique_ptr<Tokenizer>* out) {
  const std::string src = spec.source;  // a copy: spec is moved into the tokenizer below
  const auto n = static_cast<int64_t>(spec.pieces.size());
  if (n == 0) return invalid_argument(src + ": the vocabulary is empty");
  if (n > INT32_MAX) return invalid_argument(src + ": " + std::to_string(n) + " tokens do not fit int32 ids");
  auto in_range = [n](int32_t id) { return id >= 0 && id < n; };
  for (const auto& [name, id] : {std::pair<const char*, int32_t>{"BOS", spec.bos}, {"EOS", spec.eos}, {"<unk>", spec.unk}})
    if (id != -1 && !in_range(id))
      return invalid_argument(src + ": " + name + " id " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(n) + ")");
  for (int32_t id : spec.end_ids)
    if (!in_range(id))
      return invalid_argument(src + ": end-of-generation id " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(n) + ")");
  if (spec.mergeable.size() != spec.pieces.size()) spec.mergeable.assign(spec.pieces.size(), true);
  if (spec.merge_mode == BpeSpec::MergeMode::kScore && static_cast<int64_t>(spec.scores.size()) != n)
    return {StatusCode::kInternal, src + ": " + std::to_string(spec.scores.size()) + " scores for " +
                                       std::to_string(n) + " pieces"};

  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer(std::move(spec)));
  const BpeSpec& s = tok->spec_;
  for (int32_t id = 0; id < n; ++id) {
    // The first id of a repeated piece wins, as a vocabulary lookup by text can only give one.
    if (s.mergeable[static_cast<size_t>(id)]) tok->lookup_.emplace(s.pieces[static_cast<size_t>(id)], id);
  }
  tok->byte_tokens_.fill(-1);
  tok->byte_of_token_.assign(static_cast<size_t>(n), -1);
  if (!s.byte_level) {
    for (int32_t id = 0; id < n; ++id) {
      const int b = parse_byte_piece(s.pieces[static_cast<size_t>(id)]);
      if (b < 0) continue;
      tok->byte_of_token_[static_cast<size_t>(id)] = static_cast<int16_t>(b);
      if (tok->byte_tokens_[static_cast<size_t>(b)] < 0) tok->byte_tokens_[static_cast<size_t>(b)] = id;
    }
  }
  for (size_t rank = 0; rank < s.merges.size(); ++rank) {
    const auto [left, right] = s.merges[rank];
    if (!in_range(left) || !in_range(right))
      return {StatusCode::kInternal, src + ": merge " + std::to_string(rank) + " has an id outside the vocabulary"};
    const std::string merged = s.pieces[static_cast<size_t>(left)] + s.pieces[static_cast<size_t>(right)];
    const auto it = tok->lookup_.find(merged);
    if (it == tok->lookup_.end())
      return invalid_argument(src + ": merge " + std::to_string(rank) + " '" + s.pieces[static_cast<size_t>(left)] +
                              " " + s.pieces[static_cast<size_t>(right)] + "' makes '" + merged +
                              "', which is not in the vocabulary");
    // A repeated merge keeps its first (best) rank.
    tok->merge_ranks_.emplace(pair_key(left, right), MergeResult{static_cast<int32_t>(rank), it->second});
  }
  tok->decodes_empty_.assign(static_cast<size_t>(n), 0);
  tok->is_special_.assign(static_cast<size_t>(n), 0);
  for (int32_t id : {s.bos, s.eos})
    if (id >= 0) tok->decodes_empty_[static_cast<size_t>(id)] = 1;
  for (int32_t id : s.control) {
    if (!in_range(id)) return {StatusCode::kInternal, src + ": control id " + std::to_string(id) + " out of range"};
    tok->decodes_empty_[static_cast<size_t>(id)] = 1;
  }
  for (const SpecialToken& t : s.specials) {
    if (!in_range(t.id))
      return invalid_argument(src + ": added token '" + t.content + "' has id " + std::to_string(t.id) +
                              " outside the vocabulary [0, " + std::to_string(n) + ")");
    if (t.content.empty()) return invalid_argument(src + ": added token " + std::to_string(t.id) + " is empty");
    tok->is_special_[static_cast<size_t>(t.id)] = 1;
    tok->special_first_byte_[static_cast<unsigned char>(t.content[0])] = true;
  }
  // Longest first, so "<|eot|>" is not cut short by a special token that is its prefix.
  std::stable_sort(tok->spec_.specials.begin(), tok->spec_.specials.end(),
                   [](const SpecialToken& a, const SpecialToken& b) { return a.content.size() > b.content.size(); });
  *out = std::move(tok);
  return {};
}

std::string BpeTokenizer::normalize(const std::string& text, bool at_start) const {
  std::string s = text;
  for (const NormalizeOp& op : spec_.normalize) {
    switch (op.kind) {
      case NormalizeOp::Kind::kReplace:
        replace_all(&s, op.from, op.to);
        break;
      case NormalizeOp::Kind::kCollapseSpaces:
        s = collapse_spaces(s);
        break;
      case NormalizeOp::Kind::kNfc:
        s = nfc(s);
        break;
      case NormalizeOp::Kind::kPrepend:
        // Never onto empty text: run.c and Hugging Face's Prepend add the dummy prefix only to
        // non-empty input, so "" stays no tokens.
        if (s.empty() || (op.first_only && !at_start)) break;
        if (op.skip_if_present && s.compare(0, op.to.size(), op.to) == 0) break;
        s = op.to + s;
        break;
    }
  }
  return s;
}

Status BpeTokenizer::encode(const std::string& text, bool add_bos, std::vector<int32_t>* out) const {
  out->clear();
  if (add_bos && bos_ >= 0) out->push_back(bos_);
  const std::string normalized = spec_.normalize_whole_text ? normalize(text, true) : text;
  // Cut the text at special tokens; what lies between is ordinary text.
  size_t segment_begin = 0;
  size_t pos = 0;
  while (pos < normalized.size()) {
    const SpecialToken* hit = nullptr;
    if (special_first_byte_[static_cast<unsigned char>(normalized[pos])]) {
      for (const SpecialToken& t : spec_.specials)
        if (normalized.compare(pos, t.content.size(), t.content) == 0) {
          hit = &t;
          break;
        }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    if (pos > segment_begin)
      LLMQ_RETURN_IF_ERROR(encode_segment(normalized.substr(segment_begin, pos - segment_begin), segment_begin == 0, out));
    out->push_back(hit->id);
    pos += hit->content.size();
    segment_begin = pos;
  }
  if (segment_begin < normalized.size())
    LLMQ_RETURN_IF_ERROR(encode_segment(normalized.substr(segment_begin), segment_begin == 0, out));
  return {};
}

Status BpeTokenizer::encode_segment(const std::string& text, bool at_start, std::vector<int32_t>* out) const {
  const std::string s = spec_.normalize_whole_text ? text : normalize(text, at_start);
  std::vector<std::string> words{s};
  for (const Splitter& splitter : spec_.splitters) {
    std::vector<std::string> next;
    for (const std::string& w : words) split_words(w, splitter, &next);
    words = std::move(next);
  }
  for (const std::string& w : words) {
    if (w.empty()) continue;
    if (!spec_.byte_level) {
      LLMQ_RETURN_IF_ERROR(encode_word(w, out));
      continue;
    }
    std::string mapped;
    for (char c : w) mapped += byte_to_unicode()[static_cast<unsigned char>(c)];
    LLMQ_RETURN_IF_ERROR(encode_word(mapped, out));
  }
  return {};
}

Status BpeTokenizer::encode_word(const std::string& word, std::vector<int32_t>* out) const {
  if (spec_.ignore_merges) {
    if (const auto it = lookup_.find(word); it != lookup_.end()) {
      out->push_back(it->second);
      return {};
    }
  }
  // One symbol per character; a character without a piece becomes its byte tokens.
  std::vector<int32_t> ids;
  for (const CodePoint& c : utf8_code_points(word)) {
    const std::string ch = word.substr(static_cast<size_t>(c.begin), static_cast<size_t>(c.size));
    if (const auto it = lookup_.find(ch); it != lookup_.end()) {
      ids.push_back(it->second);
      continue;
    }
    bool have_bytes = spec_.byte_fallback;
    for (char b : ch) have_bytes = have_bytes && byte_tokens_[static_cast<unsigned char>(b)] >= 0;
    if (have_bytes) {
      for (char b : ch) ids.push_back(byte_tokens_[static_cast<unsigned char>(b)]);
    } else if (spec_.unk >= 0) {
      if (!(spec_.fuse_unk && !ids.empty() && ids.back() == spec_.unk)) ids.push_back(spec_.unk);
    } else {
      return invalid_argument("text: character " + hex_code_point(c.value) + " ('" + ch + "') has no token in " +
                              spec_.source + ", which has neither byte tokens nor an <unk> token");
    }
  }
  merge_symbols(&ids);
  out->insert(out->end(), ids.begin(), ids.end());
  return {};
}

bool BpeTokenizer::find_merge(int32_t left, int32_t right, double* priority, int32_t* merged) const {
  if (spec_.merge_mode == BpeSpec::MergeMode::kRank) {
    const auto it = merge_ranks_.find(pair_key(left, right));
    if (it == merge_ranks_.end()) return false;
    *priority = it->second.rank;
    *merged = it->second.merged;
    return true;
  }
  const auto it = lookup_.find(spec_.pieces[static_cast<size_t>(left)] + spec_.pieces[static_cast<size_t>(right)]);
  if (it == lookup_.end()) return false;
  *priority = -static_cast<double>(spec_.scores[static_cast<size_t>(it->second)]);  // highest score first
  *merged = it->second;
  return true;
}

void BpeTokenizer::merge_symbols(std::vector<int32_t>* ids) const {
  const auto n = static_cast<int64_t>(ids->size());
  if (n < 2) return;
  struct Symbol {
    int32_t id;
    int64_t prev, next;  // -1 at the ends
    bool alive;
  };
  struct Candidate {
    double priority;
    int64_t left;  // symbol index; symbols keep their original order, so this orders positions
    int32_t left_id, right_id, merged;
  };
  // std::priority_queue pops the largest: "larger" = worse priority, then further right.
  auto worse = [](const Candidate& a, const Candidate& b) {
    return a.priority != b.priority ? a.priority > b.priority : a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> heap(worse);
  std::vector<Symbol> sym(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) sym[static_cast<size_t>(i)] = {(*ids)[static_cast<size_t>(i)], i - 1, i + 1 < n ? i + 1 : -1, true};
  auto push_pair = [&](int64_t left) {
    if (left < 0) return;
    const int64_t right = sym[static_cast<size_t>(left)].next;
    if (right < 0) return;
    Candidate c{0.0, left, sym[static_cast<size_t>(left)].id, sym[static_cast<size_t>(right)].id, 0};
    if (find_merge(c.left_id, c.right_id, &c.priority, &c.merged)) heap.push(c);
  };
  for (int64_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& l = sym[static_cast<size_t>(c.left)];
    // Stale: a neighbour merged since. A surviving symbol's id only ever changes to a longer
    // piece, so matching ids mean the pair is still exactly what was pushed.
    if (!l.alive || l.next < 0 || l.id != c.left_id) continue;
    Symbol& r = sym[static_cast<size_t>(l.next)];
    if (r.id != c.right_id) continue;
    l.id = c.merged;
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = c.left;
    push_pair(l.prev);
    push_pair(c.left);
  }
  ids->clear();
  for (int64_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) ids->push_back(sym[static_cast<size_t>(i)].id);
}

Status BpeTokenizer::decode_token(int32_t prev, int32_t token, std::string* piece) const {
  piece->clear();
  if (token < 0 || token >= vocab_size_)
    return invalid_argument("token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                            std::to_string(vocab_size_) + ") of " + spec_.source);
  const auto t = static_cast<size_t>(token);
  if (decodes_empty_[t]) return {};
  const std::string& p = spec_.pieces[t];
  if (is_special_[t]) {
    *piece = p;  // added tokens are stored as the text they match
    return {};
  }
  if (byte_of_token_[t] >= 0) {
    *piece = std::string(1, static_cast<char>(byte_of_token_[t]));
    return {};
  }
  if (spec_.byte_level) {
    for (const CodePoint& c : utf8_code_points(p)) {
      const int b = byte_from_unicode(c.value);
      if (b >= 0)
        *piece += static_cast<char>(b);
      else
        piece->append(p, static_cast<size_t>(c.begin), static_cast<size_t>(c.size));
    }
    return {};
  }
  *piece = p;
  if (!spec_.space_symbol.empty() && spec_.space_symbol != " ") replace_all(piece, spec_.space_symbol, " ");
  if (spec_.strip_leading_space && (prev < 0 || prev == bos_) && !piece->empty() && (*piece)[0] == ' ')
    piece->erase(0, 1);
  return {};
}

}  // namespace llmq::tokenizer_detail
