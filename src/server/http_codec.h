// HTTP/1.1 and SSE byte framing shared by the server and its tests: response heads, chunked
// transfer encoding and `data: ...\n\n` server-sent events. Pure functions, no I/O.
#pragma once

#include <string>
#include <string_view>

namespace moeserve::server {

[[nodiscard]] std::string_view status_reason(int status);

// A complete response: status line, Content-Type, Content-Length, Connection, body.
[[nodiscard]] std::string serialize_response(int status, std::string_view content_type,
                                             std::string_view body, bool keep_alive,
                                             std::string_view extra_headers = {});

// The head of a streamed (SSE) response. HTTP/1.1 uses chunked transfer encoding; for HTTP/1.0
// (chunked = false) the body is raw and ends when the connection closes.
[[nodiscard]] std::string serialize_stream_head(bool chunked, bool keep_alive);

// Appends `data` as one HTTP chunk ("<hex len>\r\n<data>\r\n"); empty data appends nothing
// (a zero-length chunk would end the body).
void append_chunk(std::string_view data, std::string& out);
// The last chunk: "0\r\n\r\n".
[[nodiscard]] std::string_view last_chunk();

// One server-sent event carrying `payload` ("data: <payload>\n\n"). payload must not contain a
// newline (compact JSON never does).
void append_sse_event(std::string_view payload, std::string& out);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace moeserve::server
