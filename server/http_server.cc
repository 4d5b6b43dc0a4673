// The one source that includes Boost.Beast and Asio (they compile slowly): the HTTP/1.1 transport
// of http_server.h. The OpenAI API over it is openai_routes.cc.
//
// A connection (Session) is a chain of asynchronous operations on its strand:
//   read loop    async_read_header, then (after "100 Continue" when asked) async_read of the body,
//                then the request goes to the router, and the next header read starts at once:
//                it is how a client that goes away mid-response is noticed (end of stream or
//                reset), and it holds at most one pipelined request until the response ends.
//   write path   the response's bytes accumulate in out_; one async_write at a time sends them
//                (under the write timeout); its completion tells the exchange when it has room.
//   idle timer   armed whenever no exchange is in progress: a request must arrive whole before it
//                fires, else the connection closes.
// The session is owned by the operations and posted work that hold its shared_ptr; it ends when
// the last of them completes after the socket is closed.

#include "server/http_server.h"

#include <algorithm>
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <chrono>
#include <cstdio>
#include <map>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/strings.h"
#include "server/log.h"

namespace lmserve::server {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;

namespace {

using Strand = net::strand<net::io_context::executor_type>;

std::chrono::steady_clock::duration Seconds(double seconds) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(seconds));
}

class SessionBase {
 public:
  virtual ~SessionBase() = default;
  // Closes the socket from the strand (Stop).
  virtual void PostClose() = 0;
};

}  // namespace

struct HttpServer::Impl {
  explicit Impl(int num_threads) : io(num_threads) {}

  // Destroyed after `io` (declared before it): destroying the io_context destroys the handlers it
  // still holds, and with them the last sessions, which use these.
  HttpServerOptions options;
  HttpRouter router;
  std::optional<ssl::context> tls;
  mutable absl::Mutex mu;
  std::map<SessionBase*, std::weak_ptr<SessionBase>> sessions ABSL_GUARDED_BY(mu);

  net::io_context io;
  // The acceptor, its retry timer and logged_accept_error are the acceptor strand's.
  Strand acceptor_strand{net::make_strand(io)};
  tcp::acceptor acceptor{acceptor_strand};
  net::steady_timer accept_retry{acceptor_strand};
  bool logged_accept_error = false;
  std::vector<std::thread> threads;
  int port = -1;
  bool stopped = false;

  void Accept();
  void OnAccept(beast::error_code ec, tcp::socket socket);
  void AddSession(const std::shared_ptr<SessionBase>& session) {
    absl::MutexLock lock(&mu);
    sessions[session.get()] = session;
  }
  void RemoveSession(SessionBase* session) {
    absl::MutexLock lock(&mu);
    sessions.erase(session);
  }
};

namespace {

// A connection over Stream: beast::tcp_stream, or beast::ssl_stream<beast::tcp_stream> for TLS.
template <class Stream>
class Session final : public SessionBase,
                      public HttpResponder,
                      public std::enable_shared_from_this<Session<Stream>> {
 public:
  template <class... StreamArgs>
  Session(HttpServer::Impl* server, StreamArgs&&... stream_args)
      : server_(server),
        stream_(std::forward<StreamArgs>(stream_args)...),
        idle_timer_(Lowest().get_executor()),
        write_timer_(Lowest().get_executor()) {}

  ~Session() override {
    if (exchange_ != nullptr) {
      exchange_->OnClientGone();
      exchange_.reset();
    }
    server_->RemoveSession(this);
  }

  void Run() {
    net::dispatch(Lowest().get_executor(), [self = this->shared_from_this()] { self->Begin(); });
  }

  void PostClose() override {
    net::post(Lowest().get_executor(), [self = this->shared_from_this()] { self->Close(); });
  }

  // ---- HttpResponder ----

  void Respond(int status, std::string_view content_type, std::string_view body,
               const HttpHeaders& headers) override {
    if (closed_ || response_started_) return;
    response_started_ = true;
    std::string head = StatusLine(status);
    head += StrCat("Content-Type: ", content_type, "\r\nContent-Length: ", body.size(), "\r\n");
    for (const auto& [name, value] : headers) head += StrCat(name, ": ", value, "\r\n");
    AppendConnectionHeader(&head);
    head += "\r\n";
    out_ += head;
    if (!head_request_) out_.append(body);
    EndResponse();
  }

  void StartEvents() override {
    if (closed_ || response_started_) return;
    response_started_ = true;
    streaming_ = true;
    chunked_ = http_version_ >= 11;
    if (!chunked_) close_after_ = true;  // HTTP/1.0: the end of the body is the end of the stream
    std::string head = StatusLine(200);
    head +=
        "Content-Type: text/event-stream\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\n";
    if (chunked_) head += "Transfer-Encoding: chunked\r\n";
    AppendConnectionHeader(&head);
    head += "\r\n";
    out_ += head;
    Flush();
  }

  void SendEvents(std::string_view bytes) override {
    if (closed_ || !streaming_ || response_ended_ || bytes.empty()) return;
    if (chunked_) {
      char size[24];
      std::snprintf(size, sizeof(size), "%zx\r\n", bytes.size());
      out_ += size;
      out_.append(bytes);
      out_ += "\r\n";
    } else {
      out_.append(bytes);
    }
    Flush();
  }

  void EndEvents() override {
    if (closed_ || !streaming_ || response_ended_) return;
    if (chunked_) out_ += "0\r\n\r\n";
    EndResponse();
  }

  bool HasRoom() const override {
    return out_.size() + in_flight_.size() < server_->options.max_buffered_bytes;
  }

  std::function<void(std::function<void()>)> Poster() override {
    return [weak = this->weak_from_this(),
            executor = Lowest().get_executor()](std::function<void()> work) {
      net::post(executor, [weak, work = std::move(work)] {
        if (std::shared_ptr<Session> self = weak.lock()) work();
      });
    };
  }

 private:
  auto& Lowest() { return beast::get_lowest_layer(stream_); }

  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  void Begin() {
    if constexpr (kTls) {
      BecomeIdle();  // the handshake, too, must end within the idle timeout
      stream_.async_handshake(ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (ec) return self->Close();
                                self->BecomeIdle();
                                self->ReadHeader();
                              });
    } else {
      BecomeIdle();
      ReadHeader();
    }
  }

  // ---- Reading ----

  void ReadHeader() {
    if (closed_) return;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(kHttpMaxHeaderBytes));
    parser_->body_limit(server_->options.max_body_bytes);
    reading_ = true;
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    reading_ = false;
    if (closed_) return;
    if (ec) return OnReadError(ec);
    const auto& header = parser_->get();
    if (beast::iequals(header[http::field::expect], "100-continue")) {
      if (exchange_ == nullptr) {
        out_ += "HTTP/1.1 100 Continue\r\n\r\n";
        Flush();
      } else {
        expect_continue_pending_ = true;  // sent once the response in progress has ended
      }
    }
    if (exchange_ != nullptr && !parser_->is_done()) {
      // A pipelined request with a body while a response is in progress: its body is read once
      // the response has ended.
      held_header_ = true;
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    reading_ = true;
    http::async_read(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnBody(ec); });
  }

  void OnBody(beast::error_code ec) {
    reading_ = false;
    if (closed_) return;
    if (ec) return OnReadError(ec);
    http::request<http::string_body> message = parser_->release();
    parser_.reset();
    HttpRequest request;
    request.method = std::string(message.method_string());
    request.target = std::string(message.target());
    request.authorization_headers = static_cast<int>(message.count(http::field::authorization));
    if (auto it = message.find(http::field::authorization); it != message.end()) {
      request.authorization = std::string(it->value());
    }
    request.content_type = std::string(message[http::field::content_type]);
    request.body = std::move(message.body());
    const bool keep_alive = message.keep_alive();
    const int version = static_cast<int>(message.version());
    if (exchange_ != nullptr || response_started_) {
      held_ = HeldRequest{std::move(request), keep_alive, version};  // pipelined
      return;
    }
    Dispatch(std::move(request), keep_alive, version);
  }

  void OnReadError(beast::error_code ec) {
    if (closed_) return;
    const bool mid_exchange = exchange_ != nullptr || response_started_;
    if (!mid_exchange) {
      int status = 0;
      std::string message;
      if (ec == http::error::header_limit) {
        status = 431;
        message = StrCat("the request line and headers exceed ", kHttpMaxHeaderBytes, " bytes");
      } else if (ec == http::error::body_limit) {
        status = 413;
        message = StrCat("the request body exceeds ", server_->options.max_body_bytes,
                         " bytes (--max-request-bytes)");
      } else if (ec.category() == http::make_error_code(http::error::header_limit).category() &&
                 ec != http::error::end_of_stream && ec != http::error::partial_message) {
        status = 400;
        message = StrCat("malformed HTTP request: ", ec.message());
      }
      if (status != 0) {
        HttpRequest request;
        if (parser_.has_value() && parser_->is_header_done()) {
          request.method = std::string(parser_->get().method_string());
          request.target = std::string(parser_->get().target());
        }
        request.transport_error_status = status;
        request.transport_error_message = std::move(message);
        parser_.reset();
        linger_ = true;
        Dispatch(std::move(request), /*keep_alive=*/false, 11);
        return;
      }
      return Close();
    }
    // The client closed or reset the connection (or sent what cannot be parsed) while its
    // response was in progress: it is gone.
    Close();
  }

  void Dispatch(HttpRequest request, bool keep_alive, int version) {
    idle_timer_.cancel();
    response_started_ = false;
    response_ended_ = false;
    streaming_ = false;
    close_after_ = !keep_alive;
    http_version_ = version;
    head_request_ = request.method == "HEAD";
    const bool transport_error = request.transport_error_status != 0;
    std::unique_ptr<HttpExchange> exchange = server_->router(std::move(request), this);
    if (closed_) return;
    if (!response_ended_) {
      exchange_ = std::move(exchange);
      // No operation may be pending while the exchange waits for the engine (no read after a
      // "Connection: close" request): the session keeps itself until the exchange ends. Every
      // entry point runs with a reference of its own, so dropping this one inside is safe.
      self_while_exchange_ = this->shared_from_this();
      if (exchange_ == nullptr) {
        // The router neither answered nor kept an exchange: a bug; answer rather than hang.
        Respond(500, "text/plain", "internal error: no response\n", {});
      }
    }
    // Watch the connection while the response is in progress (see the file comment), even after
    // "Connection: close": a client that goes away is noticed the same way.
    if (!transport_error && !reading_ && !closed_ && !response_ended_) ReadHeader();
  }

  // ---- Writing ----

  void EndResponse() {
    response_ended_ = true;
    Flush();
  }

  void Flush() {
    if (closed_ || writing_ || out_.empty()) return;
    in_flight_.swap(out_);
    out_.clear();
    writing_ = true;
    // A write that makes no progress within the timeout ends the connection (a reader that
    // stopped reading); Beast's own stream timers stay off, so reads have none.
    write_timer_.expires_after(Seconds(server_->options.write_timeout_seconds));
    write_timer_.async_wait([self = this->shared_from_this()](beast::error_code ec) {
      if (!ec && self->writing_) self->Close();
    });
    net::async_write(
        stream_, net::buffer(in_flight_),
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnWrite(ec); });
  }

  void OnWrite(beast::error_code ec) {
    writing_ = false;
    write_timer_.cancel();
    in_flight_.clear();
    if (closed_) return;  // a write that completed after Close: nothing more to do
    if (ec) {
      Close();
      return;
    }
    if (!out_.empty()) {
      const bool had_room = HasRoom();
      Flush();
      if (had_room && exchange_ != nullptr && !response_ended_) exchange_->OnRoom();
      return;
    }
    if (response_ended_) {
      FinishExchange();
      return;
    }
    if (exchange_ != nullptr) exchange_->OnRoom();
  }

  // The response has been written whole.
  void FinishExchange() {
    exchange_.reset();  // never from inside the exchange's own calls: this runs in OnWrite
    self_while_exchange_.reset();
    response_started_ = false;
    response_ended_ = false;
    streaming_ = false;
    if (close_after_) {
      if (linger_) return LingerClose();
      Close();
      return;
    }
    BecomeIdle();
    if (held_.has_value()) {
      HeldRequest held = *std::move(held_);
      held_.reset();
      Dispatch(std::move(held.request), held.keep_alive, held.version);
      return;
    }
    if (expect_continue_pending_) {
      expect_continue_pending_ = false;
      out_ += "HTTP/1.1 100 Continue\r\n\r\n";
      Flush();
    }
    if (held_header_) {
      held_header_ = false;
      ReadBody();
    } else if (!reading_) {
      ReadHeader();
    }
  }

  void BecomeIdle() {
    if (closed_) return;  // a timer armed now would keep the closed session alive
    idle_timer_.expires_after(Seconds(server_->options.idle_timeout_seconds));
    idle_timer_.async_wait([self = this->shared_from_this()](beast::error_code ec) {
      if (ec) return;  // cancelled: a request arrived
      if (self->exchange_ == nullptr && !self->response_started_) self->Close();
    });
  }

  // ---- Ending ----

  // After an error answer to a request whose body is still arriving (413): closing at once would
  // make the kernel reset the connection, and the client could lose the answer before reading it.
  // So the sending side closes, and what the client still sends is read and dropped for a moment.
  void LingerClose() {
    if constexpr (kTls) {
      Close();
    } else {
      beast::error_code ignored;
      Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
      idle_timer_.expires_after(std::chrono::seconds(2));
      idle_timer_.async_wait([self = this->shared_from_this()](beast::error_code ec) {
        if (!ec) self->Close();
      });
      Discard();
    }
  }

  void Discard() {
    if (closed_) return;
    constexpr size_t kMaxDiscardedBytes = size_t{64} << 20;
    if (discarded_bytes_ > kMaxDiscardedBytes) return Close();
    discard_.resize(16384);
    Lowest().socket().async_read_some(
        net::buffer(discard_), [self = this->shared_from_this()](beast::error_code ec, size_t n) {
          if (ec) return self->Close();
          self->discarded_bytes_ += n;
          self->Discard();
        });
  }

  // Closes the connection; an exchange in progress learns that its client is gone.
  void Close() {
    if (closed_) return;
    closed_ = true;
    idle_timer_.cancel();
    write_timer_.cancel();
    beast::error_code ignored;
    Lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
    Lowest().close();
    if (exchange_ != nullptr) {
      std::unique_ptr<HttpExchange> exchange = std::move(exchange_);
      exchange->OnClientGone();
    }
    self_while_exchange_.reset();
  }

  std::string StatusLine(int status) const {
    return StrCat("HTTP/1.", http_version_ >= 11 ? "1" : "0", " ", status, " ",
                  std::string_view(http::obsolete_reason(static_cast<http::status>(status))),
                  "\r\nServer: lmserve\r\n");
  }

  void AppendConnectionHeader(std::string* head) const {
    if (close_after_) {
      *head += "Connection: close\r\n";
    } else if (http_version_ < 11) {
      *head += "Connection: keep-alive\r\n";
    }
  }

  struct HeldRequest {
    HttpRequest request;
    bool keep_alive;
    int version;
  };

  HttpServer::Impl* const server_;
  Stream stream_;
  net::steady_timer idle_timer_;
  net::steady_timer write_timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::unique_ptr<HttpExchange> exchange_;
  std::shared_ptr<Session> self_while_exchange_;  // set while exchange_ is
  std::optional<HeldRequest> held_;               // a pipelined request, read whole
  std::string out_;                               // response bytes not yet handed to a write
  std::string in_flight_;                         // the bytes of the write in progress
  int http_version_ = 11;
  bool reading_ = false;
  bool writing_ = false;
  bool closed_ = false;
  bool response_started_ = false;  // Respond or StartEvents called for the current exchange
  bool response_ended_ = false;    // Respond or EndEvents called: ends once written
  bool streaming_ = false;
  bool chunked_ = false;
  bool close_after_ = false;
  bool head_request_ = false;
  bool held_header_ = false;  // a pipelined header was read; its body waits
  bool expect_continue_pending_ = false;
  bool linger_ = false;  // close with LingerClose
  std::string discard_;
  size_t discarded_bytes_ = 0;
};

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor.async_accept(net::make_strand(io), [this](beast::error_code ec, tcp::socket socket) {
    OnAccept(ec, std::move(socket));
  });
}

void HttpServer::Impl::OnAccept(beast::error_code ec, tcp::socket socket) {
  if (!acceptor.is_open() || ec == net::error::operation_aborted) return;
  if (ec) {
    // Typically EMFILE: no file descriptor for the connection. Try again shortly rather than spin.
    if (!logged_accept_error) {
      logged_accept_error = true;
      LogWarning("HTTP: cannot accept a connection: ", ec.message(),
                 " (further accept errors are not logged)");
    }
    accept_retry.expires_after(std::chrono::milliseconds(50));
    accept_retry.async_wait([this](beast::error_code wait_ec) {
      if (!wait_ec && acceptor.is_open()) Accept();
    });
    return;
  }
  beast::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  std::shared_ptr<SessionBase> session;
  if (tls.has_value()) {
    auto tls_session = std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(
        this, std::move(socket), *tls);
    session = tls_session;
    AddSession(session);
    tls_session->Run();
  } else {
    auto plain_session = std::make_shared<Session<beast::tcp_stream>>(this, std::move(socket));
    session = plain_session;
    AddSession(session);
    plain_session->Run();
  }
  Accept();
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpRouter router) {
  auto impl = std::make_unique<Impl>(std::max(1, options.num_threads));
  impl->options = options;
  impl->router = std::move(router);
  if (!options.cert_pem.empty()) {
    impl->tls.emplace(ssl::context::tls_server);
    ssl::context& context = *impl->tls;
    beast::error_code ec;
    context.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                            ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                            ssl::context::no_tlsv1_1,
                        ec);
    context.use_certificate_chain(net::buffer(options.cert_pem), ec);
    if (ec) return absl::InvalidArgumentError(StrCat("--tls-cert: ", ec.message()));
    context.use_private_key(net::buffer(options.key_pem), ssl::context::pem, ec);
    if (ec) return absl::InvalidArgumentError(StrCat("--tls-key: ", ec.message()));
    if (!options.client_ca_pem.empty()) {
      context.add_certificate_authority(net::buffer(options.client_ca_pem), ec);
      if (ec) return absl::InvalidArgumentError(StrCat("--tls-client-ca: ", ec.message()));
      context.set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
    }
  }
  const std::string address = options.host.size() > 1 && options.host.front() == '['
                                  ? options.host.substr(1, options.host.size() - 2)
                                  : options.host;
  beast::error_code ec;
  const net::ip::address ip = net::ip::make_address(address, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        StrCat("--host: '", options.host, "' is not an IP address: ", ec.message()));
  }
  const tcp::endpoint endpoint(ip, static_cast<unsigned short>(options.port));
  Impl& m = *impl;
  m.acceptor.open(endpoint.protocol(), ec);
  if (!ec) m.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) m.acceptor.bind(endpoint, ec);
  if (!ec) m.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(StrCat("--http-port: cannot listen on ", options.host, ":",
                                         options.port, ": ", ec.message()));
  }
  m.port = m.acceptor.local_endpoint().port();
  m.Accept();
  const int num_threads = std::max(1, options.num_threads);
  for (int i = 0; i < num_threads; ++i) {
    m.threads.emplace_back([&m] { m.io.run(); });
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::port() const { return impl_->port; }

int HttpServer::num_connections() const {
  absl::MutexLock lock(&impl_->mu);
  return static_cast<int>(impl_->sessions.size());
}

void HttpServer::Stop() {
  Impl& m = *impl_;
  if (m.stopped) return;
  m.stopped = true;
  net::post(m.acceptor.get_executor(), [&m] {
    beast::error_code ignored;
    m.acceptor.close(ignored);
    m.accept_retry.cancel();
  });
  std::vector<std::shared_ptr<SessionBase>> sessions;
  {
    absl::MutexLock lock(&m.mu);
    for (auto& [pointer, weak] : m.sessions) {
      if (std::shared_ptr<SessionBase> session = weak.lock()) sessions.push_back(session);
    }
  }
  // Outside the lock: dropping the last reference destroys a session, which takes the lock.
  for (const std::shared_ptr<SessionBase>& session : sessions) session->PostClose();
  sessions.clear();
  // The closes complete every operation at once; allow them a moment, then stop regardless.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (num_connections() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (const int left = num_connections(); left > 0) {
    LogWarning("HTTP: ", left, " connections had not closed 2 s after the stop");
  }
  m.io.stop();
  for (std::thread& thread : m.threads) thread.join();
  m.threads.clear();
}

}  // namespace lmserve::server
