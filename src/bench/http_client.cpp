#include "bench/http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <optional>

namespace moeserve::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

Result<HttpEndpoint> parse_base_url(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (url.substr(0, kScheme.size()) != kScheme)
    return make_error(ErrorCode::kInvalidArgument, "base URL must start with http:// (got {})",
                      url);
  url.remove_prefix(kScheme.size());
  HttpEndpoint ep;
  const size_t slash = url.find('/');
  std::string_view hostport = url.substr(0, slash);
  if (slash != std::string_view::npos) ep.base_path = std::string(url.substr(slash));
  while (!ep.base_path.empty() && ep.base_path.back() == '/') ep.base_path.pop_back();
  const size_t colon = hostport.rfind(':');
  if (colon != std::string_view::npos && hostport.find(']') == std::string_view::npos) {
    ep.host = std::string(hostport.substr(0, colon));
    ep.port = std::string(hostport.substr(colon + 1));
  } else {
    ep.host = std::string(hostport);
    ep.port = "80";
  }
  if (ep.host.empty()) return make_error(ErrorCode::kInvalidArgument, "no host in {}", url);
  return ep;
}

struct HttpClient::Impl {
  HttpEndpoint endpoint;
  asio::io_context ioc;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;

  // Runs one asynchronous operation to completion on this thread; the stream's expiry bounds it.
  template <typename Start>
  beast::error_code run(Start&& start) {
    beast::error_code result = asio::error::would_block;
    start([&](beast::error_code ec, std::size_t) { result = ec; });
    ioc.restart();
    ioc.run();
    return result;
  }

  Status connect(Clock::time_point deadline) {
    stream.emplace(ioc);
    buffer.clear();
    tcp::resolver resolver(ioc);
    beast::error_code ec;
    auto results = resolver.resolve(endpoint.host, endpoint.port, ec);
    if (ec) return make_error(ErrorCode::kIo, "resolve {}: {}", endpoint.host, ec.message());
    stream->expires_at(deadline);
    beast::error_code cec = asio::error::would_block;
    stream->async_connect(results, [&](beast::error_code e, const tcp::endpoint&) { cec = e; });
    ioc.restart();
    ioc.run();
    if (cec)
      return make_error(ErrorCode::kIo, "connect {}:{}: {}", endpoint.host, endpoint.port,
                        cec.message());
    return ok_status();
  }

  void close() {
    if (stream) {
      beast::error_code ec;
      stream->socket().shutdown(tcp::socket::shutdown_both, ec);
      stream->socket().close(ec);
      stream.reset();
    }
  }
};

HttpClient::HttpClient(HttpEndpoint endpoint) : impl_(std::make_unique<Impl>()) {
  impl_->endpoint = std::move(endpoint);
}

HttpClient::~HttpClient() { impl_->close(); }

Result<HttpResponse> HttpClient::request(
    std::string_view method, std::string_view path, std::string_view body,
    const std::vector<std::pair<std::string, std::string>>& headers, Clock::time_point deadline,
    const BodyCallback& on_body) {
  Impl& s = *impl_;
  http::request<http::string_body> req{http::string_to_verb(method),
                                       s.endpoint.base_path + std::string(path), 11};
  req.set(http::field::host, s.endpoint.host + ":" + s.endpoint.port);
  req.set(http::field::user_agent, "moeserve-bench");
  for (const auto& [k, v] : headers) req.set(k, v);
  if (!body.empty() || method == "POST") {
    req.set(http::field::content_type, "application/json");
    req.body() = std::string(body);
    req.prepare_payload();
  }
  req.keep_alive(true);

  // A reused connection may have been closed by the server meanwhile: one retry on a fresh one
  // if the write fails or nothing was read.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool reused = s.stream.has_value();
    if (!reused) MS_RETURN_IF_ERROR(s.connect(deadline));
    s.stream->expires_at(deadline);
    beast::error_code ec =
        s.run([&](auto&& h) { http::async_write(*s.stream, req, std::move(h)); });
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(boost::none);
    if (!ec) {
      ec = s.run(
          [&](auto&& h) { http::async_read_header(*s.stream, s.buffer, parser, std::move(h)); });
    }
    if (ec) {
      s.close();
      if (reused && attempt == 0 && ec != beast::error::timeout) continue;
      if (ec == beast::error::timeout)
        return make_error(ErrorCode::kCancelled, "request timed out before the response header");
      return make_error(ErrorCode::kIo, "HTTP {} {}: {}", method, path, ec.message());
    }
    HttpResponse resp;
    resp.status = static_cast<int>(parser.get().result_int());
    char chunk[16384];
    while (!parser.is_done()) {
      parser.get().body().data = chunk;
      parser.get().body().size = sizeof(chunk);
      ec = s.run(
          [&](auto&& h) { http::async_read_some(*s.stream, s.buffer, parser, std::move(h)); });
      if (ec == http::error::need_buffer) ec = {};
      if (ec) {
        s.close();
        if (ec == beast::error::timeout)
          return make_error(ErrorCode::kCancelled, "request timed out while streaming");
        return make_error(ErrorCode::kIo, "reading body: {}", ec.message());
      }
      const size_t n = sizeof(chunk) - parser.get().body().size;
      if (n > 0) {
        if (on_body)
          on_body(std::string_view(chunk, n));
        else
          resp.body.append(chunk, n);
      }
    }
    if (!parser.get().keep_alive()) s.close();
    return resp;
  }
  return make_error(ErrorCode::kIo, "HTTP {} {}: connection failed", method, path);
}

}  // namespace moeserve::bench
