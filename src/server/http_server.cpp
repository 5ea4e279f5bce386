// The only translation unit that includes Beast/Asio (they are template-heavy).
#include "server/http_server.h"

#include <sys/resource.h>

#include <chrono>
#include <csignal>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/logging.h"
#include "server/http_codec.h"

namespace moeserve::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

// What sessions share with the server; outlives every session (each holds a shared_ptr).
struct SharedState {
  SharedState(OpenAiApi& a, ServerMetrics& m, HttpServerOptions o)
      : api(a), metrics(m), options(std::move(o)) {}
  OpenAiApi& api;
  ServerMetrics& metrics;
  HttpServerOptions options;
  std::mutex post_mu;
  bool stopped = false;  // guarded by post_mu: no more posting to the io_context
};

class Session final : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<SharedState> shared)
      : stream_(std::move(socket)),
        shared_(std::move(shared)),
        idle_timer_(stream_.get_executor()) {
    shared_->metrics.connection_opened();
  }
  ~Session() { shared_->metrics.connection_closed(); }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read(); });
  }

  // --- ResponseChannel operations (on the strand; `seq` names the request) ---
  void post(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(shared_->post_mu);
    if (shared_->stopped) return;
    net::post(stream_.get_executor(), std::move(fn));
  }

  void respond(uint64_t seq, int status, std::string_view content_type, std::string body) {
    if (seq != seq_ || state_ != State::kPending || closed_) return;
    pending_ += serialize_response(status, content_type, body, keep_alive_);
    state_ = State::kDone;
    flush();
  }

  void start_stream(uint64_t seq) {
    if (seq != seq_ || state_ != State::kPending || closed_) return;
    chunked_ = version_ >= 11;
    if (!chunked_) keep_alive_ = false;
    pending_ += serialize_stream_head(chunked_, keep_alive_);
    state_ = State::kStreaming;
    flush();
  }

  void write(uint64_t seq, std::string_view data) {
    if (seq != seq_ || state_ != State::kStreaming || closed_) return;
    if (chunked_) {
      append_chunk(data, pending_);
    } else {
      pending_ += data;
    }
    flush();
  }

  void end_stream(uint64_t seq) {
    if (seq != seq_ || state_ != State::kStreaming || closed_) return;
    if (chunked_) pending_ += last_chunk();
    state_ = State::kDone;
    flush();
  }

  void set_on_close(uint64_t seq, std::function<void()> cb) {
    if (seq != seq_) return;
    if (closed_) {
      if (cb) cb();
      return;
    }
    on_close_ = std::move(cb);
  }

  [[nodiscard]] bool closed(uint64_t seq) const { return closed_ || seq != seq_; }
  [[nodiscard]] size_t pending_bytes() const { return pending_.size() + inflight_.size(); }

 private:
  enum class State { kIdle, kPending, kStreaming, kDone };

  void do_read() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(shared_->options.max_body_bytes);
    parser_->header_limit(static_cast<uint32_t>(shared_->options.max_header_bytes));
    stream_.expires_after(to_ms(shared_->options.idle_timeout_s));
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Session::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, size_t /*bytes*/) {
    if (closed_) return;
    if (ec) {
      if (ec == http::error::body_limit) {
        return reply_and_close(413,
                               fmt::format("Request body too large: the limit is {} bytes.",
                                           shared_->options.max_body_bytes),
                               "request_too_large");
      }
      if (ec == http::error::header_limit) {
        return reply_and_close(431, "Request headers too large.", "headers_too_large");
      }
      if (ec.category() == http::make_error_code(http::error::end_of_stream).category() &&
          ec != http::error::end_of_stream && ec != http::error::partial_message) {
        return reply_and_close(400, fmt::format("Malformed HTTP request: {}", ec.message()),
                               "bad_http_request");
      }
      return connection_lost();  // end of stream, timeout, reset
    }
    stream_.expires_never();
    auto& req = parser_->get();
    keep_alive_ = req.keep_alive();
    version_ = req.version();
    HttpRequest request;
    request.method = std::string(req.method_string());
    request.target = std::string(req.target());
    request.authorization = std::string(req[http::field::authorization]);
    request.body = std::move(req.body());
    parser_.reset();
    ++seq_;
    state_ = State::kPending;
    on_close_ = nullptr;
    shared_->api.handle(std::move(request), make_channel());
    // Watch the socket while the response is produced: a client that goes away is seen here.
    if (state_ != State::kIdle && !watching_ && !closed_) start_watch();
  }

  void reply_and_close(int status, std::string message, std::string code) {
    ApiError err{status, std::move(message), "invalid_request_error", "", std::move(code)};
    shared_->metrics.record_http_status(status);
    keep_alive_ = false;
    linger_ = true;
    ++seq_;
    state_ = State::kDone;
    pending_ += serialize_response(status, "application/json", err.to_json(), false);
    flush();
  }

  std::shared_ptr<ResponseChannel> make_channel();

  void start_watch() {
    watching_ = true;
    stream_.async_read_some(buffer_.prepare(4096),
                            beast::bind_front_handler(&Session::on_watch, shared_from_this()));
  }

  void on_watch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (closed_) return;
    // Cancelled by after_response(): the next request is already in the buffer.
    if (ec == net::error::operation_aborted && state_ == State::kIdle) return do_read();
    if (ec) return connection_lost();
    buffer_.commit(n);
    if (state_ == State::kIdle) {  // the response is done; this is the next request
      idle_timer_.cancel();
      return do_read();
    }
    // Pipelined bytes during a response: keep them (up to a bound) for the next request.
    if (buffer_.size() < 65536) start_watch();
  }

  void flush() {
    if (writing_ || closed_) return;
    if (pending_.empty()) {
      if (state_ == State::kDone) after_response();
      return;
    }
    writing_ = true;
    inflight_.swap(pending_);
    pending_.clear();
    net::async_write(stream_, net::buffer(inflight_),
                     beast::bind_front_handler(&Session::on_write, shared_from_this()));
  }

  void on_write(beast::error_code ec, size_t /*bytes*/) {
    writing_ = false;
    inflight_.clear();
    if (closed_) return;
    if (ec) return connection_lost();
    flush();
  }

  void after_response() {
    state_ = State::kIdle;
    on_close_ = nullptr;
    if (!keep_alive_) {
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      if (linger_ && !watching_) return linger();
      return close();
    }
    if (watching_ && buffer_.size() > 0) {
      // Pipelined bytes already arrived: stop the watch read (nothing else is pending).
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
      return;
    }
    if (watching_) {
      // The pending watch read doubles as the first read of the next request.
      idle_timer_.expires_after(to_ms(shared_->options.idle_timeout_s));
      idle_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
        if (!ec && self->state_ == State::kIdle && self->watching_) self->close();
      });
      return;
    }
    do_read();
  }

  // After an early error answer (413, 400), read and discard what the client is still sending for
  // a while, so it gets to read the answer instead of a reset.
  void linger() {
    idle_timer_.expires_after(std::chrono::seconds(5));
    idle_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->close();
    });
    linger_read();
  }

  void linger_read() {
    if (closed_) return;
    scratch_.resize(64 * 1024);
    stream_.socket().async_read_some(net::buffer(scratch_),
                                     [self = shared_from_this()](beast::error_code ec, size_t n) {
                                       self->lingered_ += n;
                                       if (ec || self->lingered_ > (256u << 20))
                                         return self->close();
                                       self->linger_read();
                                     });
  }

  void connection_lost() {
    if (closed_) return;
    close();
    if (auto cb = std::move(on_close_)) cb();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    idle_timer_.cancel();
    beast::error_code ignored;
    stream_.socket().close(ignored);
    pending_.clear();
  }

  beast::tcp_stream stream_;
  std::shared_ptr<SharedState> shared_;
  net::steady_timer idle_timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  uint64_t seq_ = 0;
  State state_ = State::kIdle;
  bool keep_alive_ = true;
  unsigned version_ = 11;
  bool chunked_ = true;
  bool watching_ = false;
  bool writing_ = false;
  bool closed_ = false;
  bool linger_ = false;
  size_t lingered_ = 0;
  std::string scratch_;
  std::string pending_;
  std::string inflight_;
  std::function<void()> on_close_;
};

class SessionChannel final : public ResponseChannel {
 public:
  SessionChannel(std::shared_ptr<Session> session, uint64_t seq)
      : session_(std::move(session)), seq_(seq) {}
  void post(std::function<void()> fn) override { session_->post(std::move(fn)); }
  void respond(int status, std::string_view content_type, std::string body) override {
    session_->respond(seq_, status, content_type, std::move(body));
  }
  void start_stream() override { session_->start_stream(seq_); }
  void write(std::string_view data) override { session_->write(seq_, data); }
  void end_stream() override { session_->end_stream(seq_); }
  void set_on_close(std::function<void()> on_close) override {
    session_->set_on_close(seq_, std::move(on_close));
  }
  [[nodiscard]] bool closed() const override { return session_->closed(seq_); }
  [[nodiscard]] size_t pending_bytes() const override { return session_->pending_bytes(); }

 private:
  std::shared_ptr<Session> session_;
  uint64_t seq_;
};

std::shared_ptr<ResponseChannel> Session::make_channel() {
  return std::make_shared<SessionChannel>(shared_from_this(), seq_);
}

void raise_fd_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
      MS_LOG_WARN("server: could not raise the open-file limit");
    }
  }
}

}  // namespace

class HttpServer::Impl {
 public:
  Impl(HttpServerOptions options, OpenAiApi& api, ServerMetrics& metrics)
      : shared_(std::make_shared<SharedState>(api, metrics, options)),
        ioc_(std::max(1, options.io_threads)),
        acceptor_(ioc_),
        signals_(ioc_, SIGINT, SIGTERM),
        drain_timer_(ioc_),
        accept_retry_timer_(ioc_) {}

  Status run() {
    const HttpServerOptions& o = shared_->options;
    raise_fd_limit();
    beast::error_code ec;
    tcp::resolver resolver(ioc_);
    auto results = resolver.resolve(o.host, std::to_string(o.port), ec);
    if (ec || results.empty()) {
      return make_error(ErrorCode::kInvalidArgument, "cannot resolve host '{}': {}", o.host,
                        ec.message());
    }
    const tcp::endpoint endpoint = results.begin()->endpoint();
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return make_error(ErrorCode::kIo, "cannot listen on {}:{}: {}", o.host, o.port, ec.message());
    }
    const auto bound = acceptor_.local_endpoint(ec);
    MS_LOG_INFO("server: listening on http://{}:{} ({} I/O threads, model '{}')", o.host,
                bound.port(), std::max(1, o.io_threads), shared_->api.options().served_model_name);
    do_accept();
    wait_signal();
    std::vector<std::thread> threads;
    for (int32_t i = 1; i < o.io_threads; ++i) threads.emplace_back([this] { ioc_.run(); });
    ioc_.run();
    for (auto& t : threads) t.join();
    {
      std::lock_guard<std::mutex> lock(shared_->post_mu);
      shared_->stopped = true;
    }
    MS_LOG_INFO("server: stopped");
    return ok_status();
  }

  void stop() {
    net::post(ioc_, [this] {
      if (!draining_) begin_drain();
    });
  }

 private:
  void do_accept() {
    acceptor_.async_accept(net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket s) {
      if (ec) {
        if (!acceptor_.is_open() || ec == net::error::operation_aborted) return;
        // EMFILE and friends: back off instead of spinning.
        MS_LOG_WARN("server: accept failed: {}", ec.message());
        accept_retry_timer_.expires_after(std::chrono::milliseconds(50));
        accept_retry_timer_.async_wait([this](beast::error_code e) {
          if (!e && acceptor_.is_open()) do_accept();
        });
        return;
      }
      beast::error_code ignored;
      s.set_option(tcp::no_delay(true), ignored);
      std::make_shared<Session>(std::move(s), shared_)->start();
      do_accept();
    });
  }

  void wait_signal() {
    signals_.async_wait([this](beast::error_code ec, int sig) {
      if (ec) return;
      if (draining_) {
        MS_LOG_WARN("server: second signal {}, stopping now", sig);
        ioc_.stop();
        return;
      }
      MS_LOG_INFO("server: signal {}: draining (up to {} s)", sig,
                  shared_->options.drain_timeout_s);
      begin_drain();
      wait_signal();
    });
  }

  void begin_drain() {
    draining_ = true;
    beast::error_code ignored;
    acceptor_.close(ignored);
    shared_->api.set_draining(true);
    drain_deadline_ = Clock::now() + to_ms(shared_->options.drain_timeout_s);
    poll_drain();
  }

  void poll_drain() {
    const auto now = Clock::now();
    const int64_t active = shared_->api.active_requests();
    if (active == 0) {
      // Give the last responses a moment to reach their sockets.
      if (!quiet_since_) quiet_since_ = now;
      if (now - *quiet_since_ >= std::chrono::milliseconds(100)) {
        ioc_.stop();
        return;
      }
    } else {
      quiet_since_.reset();
      if (now >= drain_deadline_ && !aborted_) {
        MS_LOG_WARN("server: drain timeout, aborting {} requests", active);
        shared_->api.abort_all();
        aborted_ = true;
        drain_deadline_ = now + std::chrono::seconds(2);
      } else if (aborted_ && now >= drain_deadline_) {
        MS_LOG_WARN("server: {} requests did not finish after abort; stopping", active);
        ioc_.stop();
        return;
      }
    }
    drain_timer_.expires_after(std::chrono::milliseconds(20));
    drain_timer_.async_wait([this](beast::error_code ec) {
      if (!ec) poll_drain();
    });
  }

  std::shared_ptr<SharedState> shared_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  net::signal_set signals_;
  net::steady_timer drain_timer_;
  net::steady_timer accept_retry_timer_;
  bool draining_ = false;
  bool aborted_ = false;
  Clock::time_point drain_deadline_;
  std::optional<Clock::time_point> quiet_since_;
};

HttpServer::HttpServer(HttpServerOptions options, OpenAiApi& api, ServerMetrics& metrics)
    : impl_(std::make_unique<Impl>(std::move(options), api, metrics)) {}

HttpServer::~HttpServer() = default;

Status HttpServer::run() { return impl_->run(); }

void HttpServer::stop() { impl_->stop(); }

}  // namespace moeserve::server
