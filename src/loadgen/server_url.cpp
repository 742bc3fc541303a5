// parse_server_url (load_generator.hpp): the --url of `llmq bench serve`, read strictly enough that
// a mistyped URL is refused by name rather than sent somewhere unexpected.
#include <string>

#include "llmq/load_generator.hpp"

namespace llmq::loadgen {

Status parse_server_url(const std::string& url, ServerUrl* out) {
  if (out == nullptr) return invalid_argument("out: null");
  const auto bad = [&url](const std::string& why) { return invalid_argument("--url: '" + url + "': " + why); };
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) return bad("expected http://HOST:PORT");
  const std::string scheme = url.substr(0, scheme_end);
  if (scheme == "https")
    return unsupported("--url: '" + url + "': https is not supported yet (plain http only)");
  if (scheme != "http") return bad("the scheme must be http, got '" + scheme + "'");
  const std::string rest = url.substr(scheme_end + 3);
  if (rest.find_first_of("?#") != std::string::npos) return bad("a query or fragment has no place in a server's URL");
  const size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  std::string prefix = slash == std::string::npos ? "" : rest.substr(slash);
  if (authority.find('@') != std::string::npos) return bad("user information is not supported (use --api-key)");
  std::string host, port_text;
  if (!authority.empty() && authority[0] == '[') {  // [IPv6]:port
    const size_t close = authority.find(']');
    if (close == std::string::npos) return bad("an IPv6 address without its closing ']'");
    host = authority.substr(1, close - 1);
    const std::string after = authority.substr(close + 1);
    if (!after.empty() && after[0] != ':') return bad("expected ':PORT' after the IPv6 address");
    if (!after.empty()) port_text = after.substr(1);
    if (!after.empty() && port_text.empty()) return bad("an empty port");
  } else {
    const size_t colon = authority.find(':');
    host = authority.substr(0, colon);
    if (colon != std::string::npos) {
      port_text = authority.substr(colon + 1);
      if (port_text.empty()) return bad("an empty port");
    }
  }
  if (host.empty()) return bad("no host");
  if (host.find_first_of(" \t\r\n") != std::string::npos) return bad("white space in the host");
  int port = 80;
  if (!port_text.empty()) {
    if (port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string::npos)
      return bad("the port '" + port_text + "' is not a number in [1, 65535]");
    port = std::stoi(port_text);
    if (port < 1 || port > 65535) return bad("the port " + port_text + " is outside [1, 65535]");
  }
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (prefix.find_first_of(" \t\r\n") != std::string::npos) return bad("white space in the path");
  *out = ServerUrl{host, port, prefix, url};
  return {};
}

}  // namespace llmq::loadgen
