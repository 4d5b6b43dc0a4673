// An asynchronous HTTP/1.1 server: Boost.Beast on Asio, kept out of this header (http_server.cc is
// the one source that includes them). A few threads run every connection through Asio (no thread
// per connection); each connection has a strand, so its work runs one piece at a time.
//
// What it does for every connection:
// - keep-alive (HTTP/1.1's default), "Expect: 100-continue", chunked request bodies, TLS;
// - bounded reads: headers up to kHttpMaxHeaderBytes (431 beyond), bodies up to max_body_bytes (413
//   beyond, told from Content-Length before the body is read), malformed requests 400; after such
//   an answer the connection closes. A request must arrive whole within idle_timeout_seconds of the
//   connection becoming idle, or the connection closes (idle keep-alive connections included);
// - bounded writes: a response's unsent bytes are the connection's only buffer. HasRoom() says
//   whether they are below max_buffered_bytes; a producer that respects it (the SSE streams do)
//   waits for OnRoom(). A write that makes no progress within write_timeout_seconds closes the
//   connection;
// - while a response is in progress the connection keeps reading, so a client that goes away is
//   noticed at once, not at the next write: the exchange gets OnClientGone.
//
// The application is a router: it gets each request (or the transport's own error, which it
// formats) and answers through the connection's HttpResponder, at once or later; an HttpExchange
// it returns lives until its response has been written or the connection is gone.

#ifndef LMSERVE_SERVER_HTTP_SERVER_H_
#define LMSERVE_SERVER_HTTP_SERVER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace lmserve::server {

// The largest request line and headers accepted, together.
inline constexpr size_t kHttpMaxHeaderBytes = 16 * 1024;

struct HttpRequest {
  std::string method;                        // "GET", "POST", ...
  std::string target;                        // the request target as sent: path and query
  std::optional<std::string> authorization;  // the Authorization header, when present
  int authorization_headers = 0;             // how many were sent (more than one is refused)
  std::string content_type;                  // the Content-Type header ("" when absent)
  std::string body;
  // Non-zero when the transport refused the request (400 malformed, 413 body too large, 431
  // headers too large): the router answers with this status and `error_message`, and the
  // connection closes after the answer. `target` may then be empty.
  int transport_error_status = 0;
  std::string transport_error_message;
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// The connection's side of one exchange. Every method must be called on the connection's strand:
// where the router runs and where Post runs its work.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  // A whole response (Content-Length framing). Ends the exchange.
  virtual void Respond(int status, std::string_view content_type, std::string_view body,
                       const HttpHeaders& headers = {}) = 0;
  // Starts a response of server-sent events: 200, text/event-stream, chunked.
  virtual void StartEvents() = 0;
  // Appends bytes (whole events, "data: ...\n\n") to the stream.
  virtual void SendEvents(std::string_view bytes) = 0;
  // Ends the stream. Ends the exchange.
  virtual void EndEvents() = 0;
  // Whether the response's unsent bytes are below the connection's bound. A producer that finds
  // no room should wait for HttpExchange::OnRoom before producing more.
  virtual bool HasRoom() const = 0;
  // A function that runs work on the connection's strand later, callable from any thread and
  // after the exchange has ended: work posted after the connection is gone is dropped, and work
  // posted after the server stopped may never run. (For the engine's output listeners.)
  virtual std::function<void(std::function<void()>)> Poster() = 0;
};

// The application's side of an exchange in progress. Its methods run on the connection's strand.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  // The unsent bytes went below the bound again.
  virtual void OnRoom() {}
  // The client went away (or the server is stopping) before the response ended; responder calls
  // have no effect from now on. The exchange is destroyed soon after, on the strand.
  virtual void OnClientGone() {}
};

// Called on the connection's strand for each request. Returns nullptr when the response is already
// complete (Respond was called), else the exchange, kept until the response ends or the client
// goes away. `responder` stays valid as long as the exchange lives.
using HttpRouter =
    std::function<std::unique_ptr<HttpExchange>(HttpRequest request, HttpResponder* responder)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  int num_threads = 2;
  size_t max_body_bytes = size_t{4} << 20;
  size_t max_buffered_bytes = size_t{256} << 10;  // a response's unsent bytes (see HasRoom)
  double idle_timeout_seconds = 60;
  double write_timeout_seconds = 60;
  // TLS when cert_pem is set: the PEM contents (not paths). With client_ca_pem, clients must
  // present a certificate it signed.
  std::string cert_pem;
  std::string key_pem;
  std::string client_ca_pem;
};

class HttpServer {
 public:
  // Binds host:port and starts the threads. Fails when the port cannot be bound or the TLS
  // material does not load.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           HttpRouter router);
  ~HttpServer();  // Stop()

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // The connections open now (tests, logs).
  int num_connections() const;

  // Stops accepting, closes every connection (exchanges in progress get OnClientGone) and joins
  // the threads. Idempotent. Work posted afterwards is dropped when the server is destroyed.
  void Stop();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_HTTP_SERVER_H_
