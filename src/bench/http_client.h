// A blocking HTTP/1.1 client for the serving benchmark on Boost.Beast (one connection, reused with
// keep-alive, reconnected on demand). Every operation has a deadline; a streamed body is handed to
// a callback as bytes arrive, so SSE chunk times are the times bytes reached the client. Not
// thread-safe: one client per lane.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/result.h"

namespace moeserve::bench {

struct HttpEndpoint {
  std::string host;
  std::string port;
  std::string base_path;  // e.g. "" or "/prefix" (no trailing slash)
};
// Parses "http://host[:port][/path]" (https is not supported).
[[nodiscard]] Result<HttpEndpoint> parse_base_url(std::string_view url);

struct HttpResponse {
  int status = 0;
  std::string body;  // when not streamed to a callback
};

class HttpClient {
 public:
  using Clock = std::chrono::steady_clock;
  using BodyCallback = std::function<void(std::string_view bytes)>;

  explicit HttpClient(HttpEndpoint endpoint);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // `path` is appended to the base path. With `on_body`, body bytes go to it and HttpResponse.body
  // stays empty. Errors: connection failures, timeouts (kCancelled), malformed HTTP.
  [[nodiscard]] Result<HttpResponse> request(
      std::string_view method, std::string_view path, std::string_view body,
      const std::vector<std::pair<std::string, std::string>>& headers, Clock::time_point deadline,
      const BodyCallback& on_body = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::bench
