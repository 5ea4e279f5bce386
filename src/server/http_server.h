// HttpServer: Boost.Beast/Asio HTTP/1.1 front end. A few I/O threads run one io_context; each
// connection is a session on its own strand (no thread per connection), with keep-alive, a body
// size limit, SSE streaming through chunked responses and client-disconnect detection (a read kept
// pending while a request is in flight sees the close). SIGINT/SIGTERM drain: stop accepting,
// let in-flight requests finish (up to drain_timeout), abort the rest, return.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/result.h"
#include "server/metrics.h"
#include "server/openai_api.h"

namespace moeserve::server {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  int32_t io_threads = 2;
  size_t max_body_bytes = 32u << 20;
  size_t max_header_bytes = 64u << 10;
  double idle_timeout_s = 120.0;  // keep-alive connections idle longer are closed
  double read_timeout_s = 60.0;   // a request must arrive in full within this
  double drain_timeout_s = 30.0;  // SIGTERM: how long in-flight requests may run on
};

class HttpServer final {
 public:
  HttpServer(HttpServerOptions options, OpenAiApi& api, ServerMetrics& metrics);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, serves until SIGINT/SIGTERM (or stop()), drains and returns. Errors: bind/listen.
  [[nodiscard]] Status run();
  // Starts the same drain as a signal (thread-safe).
  void stop();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve::server
