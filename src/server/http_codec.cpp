#include "server/http_codec.h"

#include <fmt/format.h>

namespace moeserve::server {

std::string_view status_reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

std::string serialize_response(int status, std::string_view content_type, std::string_view body,
                               bool keep_alive, std::string_view extra_headers) {
  std::string out = fmt::format(
      "HTTP/1.1 {} {}\r\nServer: moeserve\r\nContent-Type: {}\r\nContent-Length: {}\r\n"
      "Connection: {}\r\n",
      status, status_reason(status), content_type, body.size(),
      keep_alive ? "keep-alive" : "close");
  out += extra_headers;
  out += "\r\n";
  out += body;
  return out;
}

std::string serialize_stream_head(bool chunked, bool keep_alive) {
  std::string out =
      "HTTP/1.1 200 OK\r\nServer: moeserve\r\nContent-Type: text/event-stream\r\n"
      "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n";
  if (chunked) out += "Transfer-Encoding: chunked\r\n";
  out += keep_alive && chunked ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  out += "\r\n";
  return out;
}

void append_chunk(std::string_view data, std::string& out) {
  if (data.empty()) return;
  out += fmt::format("{:x}\r\n", data.size());
  out += data;
  out += "\r\n";
}

std::string_view last_chunk() { return "0\r\n\r\n"; }

void append_sse_event(std::string_view payload, std::string& out) {
  out += "data: ";
  out += payload;
  out += "\n\n";
}

}  // namespace moeserve::server
