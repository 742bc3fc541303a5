// Reading what a user hands llmq, bounded: regular files only (a FIFO, a device, a directory or a
// symbolic-link loop is refused by name, never read until it ends), sizes capped before a byte is
// read, and JSON nesting capped before the parser recurses. Every file llmq reads whole goes
// through read_input_file, and every JSON text through parse_json_text, so these limits are
// decided here once.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "llmq/status.hpp"

namespace llmq {

// Caps. JSON files llmq reads are small (config.json: a few KB; tokenizer.json: tens of MB; a
// 70B model's calibration statistics: about 100 MB); the caps sit far above real files and far
// below what would exhaust memory.
constexpr int64_t kMaxConfigJsonBytes = int64_t{16} << 20;
constexpr int64_t kMaxSideFileBytes = int64_t{512} << 20;  // tokenizer.json, stats, token data
// Real files nest at most about 8 deep (tokenizer.json); 64 leaves room and keeps every recursive
// walk (parse, copy, dump, destroy) far from the stack's end.
constexpr int kMaxJsonDepth = 64;

// Open `path` for reading, refusing anything but a regular file (symbolic links to one are
// followed unless follow_links is false: llmq's own files, such as a staging manifest, are never
// read through a link). The FIFO check happens without blocking: the open itself never waits for
// a writer. *size is the file's size at open. The caller closes *fd.
Status open_input_file(const std::string& path, int* fd, int64_t* size, bool follow_links = true);

// The whole of a regular file of at most max_bytes. `what` names its role in errors ("--stats",
// "config.json", ...); the path is always named too.
Status read_input_file(const std::string& what, const std::string& path, int64_t max_bytes, std::string* out,
                       bool follow_links = true);

// Whether `path` names a regular file (following symbolic links); `*error` says why not when it
// exists as something else (a FIFO, a device, a directory, a link loop). False with an empty error
// when nothing is there.
bool is_input_file(const std::string& path, std::string* error = nullptr);

// Whether anything is there under the name (a dangling link or a link loop included): a side file
// present as a FIFO, a directory or a loop is then read, and so refused by name, not skipped.
bool path_present(const std::string& path);

// Parse JSON text with nlohmann, refusing nesting deeper than kMaxJsonDepth (checked by a linear
// scan before parsing) and turning parse errors into a Status naming `source`.
Status parse_json_text(const std::string& source, const char* begin, const char* end, nlohmann::json* out);
Status parse_json_text(const std::string& source, const std::string& text, nlohmann::json* out);
Status parse_json_text(const std::string& source, const std::string& text, nlohmann::ordered_json* out);
// The deepest nesting of arrays and objects in `text` (brackets inside strings do not count).
int64_t json_nesting_depth(const char* begin, const char* end);

}  // namespace llmq
