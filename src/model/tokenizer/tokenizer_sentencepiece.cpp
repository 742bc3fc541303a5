// Score-merged BPE vocabularies -> BpeSpec: sentencepiece's tokenizer.model (a protobuf ModelProto,
// read from the wire format by hand so llmq needs no protobuf library) and llama2.c's
// tokenizer.bin (int32 max_token_length, then per token float32 score, int32 length, bytes).
// Every length and offset is checked against the file, and errors name the file and byte offset.
#include <cstring>

#include "model/tokenizer/tokenizer_bpe.hpp"

namespace llmq::tokenizer_detail {
namespace {

// sentencepiece_model.proto: ModelProto fields, SentencePiece.Type and TrainerSpec.ModelType.
constexpr uint32_t kModelPieces = 1, kModelTrainerSpec = 2, kModelNormalizerSpec = 3;
constexpr uint32_t kPieceText = 1, kPieceScore = 2, kPieceType = 3;
constexpr uint32_t kTrainerModelType = 3, kTrainerUnkId = 40, kTrainerBosId = 41, kTrainerEosId = 42;
constexpr uint32_t kNormalizerAddDummyPrefix = 3, kNormalizerRemoveExtraWhitespaces = 4,
                   kNormalizerEscapeWhitespaces = 5;
enum PieceType : int64_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };
constexpr int64_t kModelTypeUnigram = 1, kModelTypeBpe = 2;
// Protobuf wire types.
constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

constexpr const char* kSpaceSymbol = "\xE2\x96\x81";  // "▁" U+2581

// A bounds-checked reader over bytes [pos, end) of one message.
class WireReader {
 public:
  WireReader(const std::string& data, size_t begin, size_t end, const std::string& path)
      : data_(data), pos_(begin), end_(end), path_(path) {}

  bool done() const { return pos_ >= end_; }
  size_t pos() const { return pos_; }

  Status tag(uint32_t* field, int* wire_type) {
    uint64_t v = 0;
    LLMQ_RETURN_IF_ERROR(varint(&v));
    *field = static_cast<uint32_t>(v >> 3);
    *wire_type = static_cast<int>(v & 7);
    if (*field == 0) return corrupt("field number 0");
    return {};
  }
  Status varint(uint64_t* out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= end_) return corrupt("a varint runs past the end");
      const auto b = static_cast<unsigned char>(data_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) {
        *out = v;
        return {};
      }
    }
    return corrupt("a varint longer than 10 bytes");
  }
  Status fixed32(uint32_t* out) {
    if (end_ - pos_ < 4) return corrupt("a 4-byte value runs past the end");
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(data_[pos_ + static_cast<size_t>(i)]);
    pos_ += 4;
    *out = v;
    return {};
  }
  // A length-delimited field: its bytes are [*begin, *end).
  Status bytes(size_t* begin, size_t* end) {
    uint64_t len = 0;
    LLMQ_RETURN_IF_ERROR(varint(&len));
    if (len > end_ - pos_)
      return corrupt("a field of " + std::to_string(len) + " bytes runs past the end (" + std::to_string(end_ - pos_) +
                     " left)");
    *begin = pos_;
    *end = pos_ + static_cast<size_t>(len);
    pos_ = *end;
    return {};
  }
  Status skip(int wire_type) {
    uint64_t v = 0;
    uint32_t v32 = 0;
    size_t b = 0, e = 0;
    switch (wire_type) {
      case kVarint: return varint(&v);
      case kFixed64:
        if (end_ - pos_ < 8) return corrupt("an 8-byte value runs past the end");
        pos_ += 8;
        return {};
      case kLengthDelimited: return bytes(&b, &e);
      case kFixed32: return fixed32(&v32);
      default: return corrupt("wire type " + std::to_string(wire_type) + " (groups and unknown types are not used)");
    }
  }
  Status corrupt(const std::string& what) const {
    return invalid_argument(path_ + ": not a valid sentencepiece model: " + what + " at byte " + std::to_string(pos_));
  }
  Status expect(int wire_type, int expected, const char* name) const {
    if (wire_type == expected) return {};
    return corrupt(std::string(name) + " has wire type " + std::to_string(wire_type) + ", expected " +
                   std::to_string(expected));
  }

 private:
  const std::string& data_;
  size_t pos_;
  size_t end_;
  const std::string& path_;
};

struct Piece {
  std::string text;
  float score = 0.0f;
  int64_t type = kNormal;
};

Status parse_piece(const std::string& data, size_t begin, size_t end, const std::string& path, Piece* out) {
  WireReader r(data, begin, end, path);
  while (!r.done()) {
    uint32_t field = 0;
    int wire = 0;
    LLMQ_RETURN_IF_ERROR(r.tag(&field, &wire));
    if (field == kPieceText) {
      LLMQ_RETURN_IF_ERROR(r.expect(wire, kLengthDelimited, "SentencePiece.piece"));
      size_t b = 0, e = 0;
      LLMQ_RETURN_IF_ERROR(r.bytes(&b, &e));
      out->text = data.substr(b, e - b);
    } else if (field == kPieceScore) {
      LLMQ_RETURN_IF_ERROR(r.expect(wire, kFixed32, "SentencePiece.score"));
      uint32_t bits = 0;
      LLMQ_RETURN_IF_ERROR(r.fixed32(&bits));
      std::memcpy(&out->score, &bits, sizeof bits);
    } else if (field == kPieceType) {
      LLMQ_RETURN_IF_ERROR(r.expect(wire, kVarint, "SentencePiece.type"));
      uint64_t v = 0;
      LLMQ_RETURN_IF_ERROR(r.varint(&v));
      out->type = static_cast<int64_t>(v);
    } else {
      LLMQ_RETURN_IF_ERROR(r.skip(wire));
    }
  }
  return {};
}

// Reads the varint fields of a sub-message listed in `fields` into `values` (int32 fields hold
// -1 as a sign-extended 64-bit varint, hence the casts through int64).
Status parse_varints(const std::string& data, size_t begin, size_t end, const std::string& path,
                     std::initializer_list<std::pair<uint32_t, int64_t*>> fields) {
  WireReader r(data, begin, end, path);
  while (!r.done()) {
    uint32_t field = 0;
    int wire = 0;
    LLMQ_RETURN_IF_ERROR(r.tag(&field, &wire));
    int64_t* target = nullptr;
    for (const auto& [number, value] : fields)
      if (number == field) target = value;
    if (target == nullptr) {
      LLMQ_RETURN_IF_ERROR(r.skip(wire));
      continue;
    }
    LLMQ_RETURN_IF_ERROR(r.expect(wire, kVarint, ("field " + std::to_string(field)).c_str()));
    uint64_t v = 0;
    LLMQ_RETURN_IF_ERROR(r.varint(&v));
    *target = static_cast<int64_t>(v);
  }
  return {};
}

int32_t find_piece(const std::vector<std::string>& pieces, const std::string& text) {
  for (size_t i = 0; i < pieces.size(); ++i)
    if (pieces[i] == text) return static_cast<int32_t>(i);
  return -1;
}

}  // namespace

Status load_sentencepiece_model(const std::string& path, std::unique_ptr<Tokenizer>* out) {
  std::string data;
  LLMQ_RETURN_IF_ERROR(read_whole_file(path, &data));
  return parse_sentencepiece_model(path, data, out);
}

Status parse_sentencepiece_model(const std::string& path, const std::string& data, std::unique_ptr<Tokenizer>* out) {
  std::vector<Piece> pieces;
  bool have_trainer = false;
  // TrainerSpec and NormalizerSpec defaults, as sentencepiece_model.proto declares them.
  int64_t model_type = kModelTypeUnigram, unk_id = 0, bos_id = 1, eos_id = 2;
  int64_t add_dummy_prefix = 1, remove_extra_whitespaces = 1, escape_whitespaces = 1;
  WireReader r(data, 0, data.size(), path);
  while (!r.done()) {
    uint32_t field = 0;
    int wire = 0;
    LLMQ_RETURN_IF_ERROR(r.tag(&field, &wire));
    if (field != kModelPieces && field != kModelTrainerSpec && field != kModelNormalizerSpec) {
      LLMQ_RETURN_IF_ERROR(r.skip(wire));
      continue;
    }
    LLMQ_RETURN_IF_ERROR(r.expect(wire, kLengthDelimited, ("ModelProto field " + std::to_string(field)).c_str()));
    size_t b = 0, e = 0;
    LLMQ_RETURN_IF_ERROR(r.bytes(&b, &e));
    if (field == kModelPieces) {
      pieces.emplace_back();
      LLMQ_RETURN_IF_ERROR(parse_piece(data, b, e, path, &pieces.back()));
    } else if (field == kModelTrainerSpec) {
      have_trainer = true;
      LLMQ_RETURN_IF_ERROR(parse_varints(data, b, e, path,
                                         {{kTrainerModelType, &model_type},
                                          {kTrainerUnkId, &unk_id},
                                          {kTrainerBosId, &bos_id},
                                          {kTrainerEosId, &eos_id}}));
    } else {
      LLMQ_RETURN_IF_ERROR(parse_varints(data, b, e, path,
                                         {{kNormalizerAddDummyPrefix, &add_dummy_prefix},
                                          {kNormalizerRemoveExtraWhitespaces, &remove_extra_whitespaces},
                                          {kNormalizerEscapeWhitespaces, &escape_whitespaces}}));
    }
  }
  if (pieces.empty()) return invalid_argument(path + ": not a valid sentencepiece model: it holds no pieces");
  // Without a TrainerSpec the file is taken to be BPE, as llama2.c's tooling writes; with one, its
  // model_type must say BPE: merging a unigram model's pieces by score would not reproduce its
  // Viterbi segmentation.
  if (have_trainer && model_type != kModelTypeBpe)
    return unsupported(path + ": sentencepiece model_type " +
                       (model_type == kModelTypeUnigram ? std::string("UNIGRAM") : std::to_string(model_type)) +
                       " is not supported (llmq reads BPE sentencepiece models)");

  BpeSpec spec;
  spec.source = path;
  spec.merge_mode = BpeSpec::MergeMode::kScore;
  spec.byte_fallback = true;  // byte pieces exist only when the model was trained with byte_fallback
  spec.normalize_whole_text = true;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    const auto id = static_cast<int32_t>(i);
    spec.pieces.push_back(p.text);
    spec.scores.push_back(p.score);
    // Only normal pieces take part in merging; user-defined ones are matched whole, and control,
    // unknown, unused and byte pieces never come out of text ("<s>" in text is not BOS).
    spec.mergeable.push_back(p.type == kNormal);
    if (p.type == kUserDefined) spec.specials.push_back({p.text, id});
    if (p.type == kControl) spec.control.push_back(id);
    if (p.type == kUnknown && spec.unk < 0) spec.unk = id;
    if (p.type < kNormal || p.type > kByte)
      return invalid_argument(path + ": not a valid sentencepiece model: piece " + std::to_string(i) + " has type " +
                              std::to_string(p.type));
  }
  if (have_trainer) {
    const auto n = static_cast<int64_t>(pieces.size());
    for (const auto& [name, id] : {std::pair<const char*, int64_t>{"unk_id", unk_id}, {"bos_id", bos_id}, {"eos_id", eos_id}})
      if (id < -1 || id >= n)
        return invalid_argument(path + ": trainer_spec." + name + " " + std::to_string(id) +
                                " is outside the vocabulary [0, " + std::to_string(n) + ")");
    spec.bos = static_cast<int32_t>(bos_id);
    spec.eos = static_cast<int32_t>(eos_id);
    if (spec.unk < 0) spec.unk = static_cast<int32_t>(unk_id);
  } else {
    spec.bos = find_piece(spec.pieces, "<s>");
    spec.eos = find_piece(spec.pieces, "</s>");
  }
  if (remove_extra_whitespaces) spec.normalize.push_back({NormalizeOp::Kind::kCollapseSpaces, "", "", false, false});
  if (add_dummy_prefix) spec.normalize.push_back({NormalizeOp::Kind::kPrepend, "", " ", false, false});
  if (escape_whitespaces) spec.normalize.push_back({NormalizeOp::Kind::kReplace, " ", kSpaceSymbol, false, false});
  spec.space_symbol = escape_whitespaces ? kSpaceSymbol : " ";
  spec.strip_leading_space = add_dummy_prefix != 0;
  spec.description = "sentencepiece BPE, " + std::to_string(pieces.size()) + " tokens (" + path + ")";
  return BpeTokenizer::create(std::move(spec), out);
}

Status load_llama2c_tokenizer(const std::string& path, std::unique_ptr<Tokenizer>* out) {
  std::string data;
  LLMQ_RETURN_IF_ERROR(read_whole_file(path, &data));
  return parse_llama2c_tokenizer(path, data, out);
}

Status read_llama2c_pieces(const std::string& path, const std::string& data, std::vector<std::string>* pieces,
                           std::vector<float>* scores) {
  auto bad = [&path](const std::string& what) {
    return invalid_argument(path + ": not a valid llama2.c tokenizer: " + what);
  };
  auto read_i32 = [&data](size_t at) {
    int32_t v = 0;
    std::memcpy(&v, data.data() + at, sizeof v);
    return v;
  };
  pieces->clear();
  scores->clear();
  if (data.size() < 4) return bad("shorter than its 4-byte header (" + std::to_string(data.size()) + " bytes)");
  const int32_t max_token_length = read_i32(0);
  if (max_token_length <= 0) return bad("max_token_length " + std::to_string(max_token_length) + " is not positive");
  size_t pos = 4;
  // The file does not store its token count (run.c takes it from the checkpoint): tokens run to
  // the end of the file, and one cut short anywhere inside is an error.
  while (pos < data.size()) {
    const std::string where = "token " + std::to_string(pieces->size()) + " at byte " + std::to_string(pos);
    if (data.size() - pos < 8) return bad(where + ": the file ends inside its score and length");
    float score = 0.0f;
    std::memcpy(&score, data.data() + pos, sizeof score);
    const int32_t len = read_i32(pos + 4);
    pos += 8;
    if (len < 0 || len > max_token_length)
      return bad(where + ": length " + std::to_string(len) + " is outside [0, max_token_length " +
                 std::to_string(max_token_length) + "]");
    if (data.size() - pos < static_cast<size_t>(len))
      return bad(where + ": its " + std::to_string(len) + " bytes run past the end of the file");
    pieces->push_back(data.substr(pos, static_cast<size_t>(len)));
    scores->push_back(score);
    pos += static_cast<size_t>(len);
  }
  if (pieces->empty()) return bad("it holds no tokens");
  return {};
}

Status parse_llama2c_tokenizer(const std::string& path, const std::string& data, std::unique_ptr<Tokenizer>* out) {
  BpeSpec spec;
  spec.source = path;
  LLMQ_RETURN_IF_ERROR(read_llama2c_pieces(path, data, &spec.pieces, &spec.scores));
  spec.merge_mode = BpeSpec::MergeMode::kScore;
  spec.mergeable.assign(spec.pieces.size(), true);  // run.c's str_lookup searches every piece
  spec.byte_fallback = true;
  spec.unk = find_piece(spec.pieces, "<unk>");
  // run.c's fixed ids, in every llama2.c vocabulary (sentencepiece's <unk> <s> </s> order).
  constexpr int32_t kBos = 1, kEos = 2;
  spec.bos = static_cast<int64_t>(spec.pieces.size()) > kBos ? kBos : -1;
  spec.eos = static_cast<int64_t>(spec.pieces.size()) > kEos ? kEos : -1;
  // The pieces hold spaces where sentencepiece has "▁"; run.c's dummy prefix is the " " token.
  spec.normalize_whole_text = true;
  spec.normalize.push_back({NormalizeOp::Kind::kPrepend, "", " ", false, false});
  spec.space_symbol = " ";
  spec.strip_leading_space = true;
  spec.description = "llama2.c tokenizer, " + std::to_string(spec.pieces.size()) + " tokens (" + path + ")";
  return BpeTokenizer::create(std::move(spec), out);
}

}  // namespace llmq::tokenizer_detail
