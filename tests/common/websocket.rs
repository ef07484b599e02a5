//! WebSocket peers: an echo server upstream, and a client handshake.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::Duration;
use tungstenite::client::IntoClientRequest;

/// An upstream WebSocket server that echoes every message, and closes the
/// connection itself when it is sent `bye`.
pub fn websocket_echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            thread::spawn(move || {
                let Ok(mut socket) = tungstenite::accept(stream) else {
                    return;
                };
                while let Ok(message) = socket.read() {
                    if message.to_text().is_ok_and(|t| t == "bye") {
                        let _ = socket.close(None);
                        while socket.read().is_ok() {}
                        return;
                    }
                    if message.is_close() || socket.send(message).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A WebSocket handshake to `path` at `addr` with `headers`: its status,
/// and the socket when it opened.
pub fn open_websocket(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, Option<tungstenite::WebSocket<TcpStream>>) {
    let stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut request = format!("ws://{addr}{path}")
        .into_client_request()
        .expect("a WebSocket request");
    for (name, value) in headers {
        let name = http::HeaderName::from_bytes(name.as_bytes()).expect("header name");
        request
            .headers_mut()
            .insert(name, value.parse().expect("header value"));
    }
    match tungstenite::client(request, stream) {
        Ok((socket, response)) => (response.status().as_u16(), Some(socket)),
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(response))) => {
            (response.status().as_u16(), None)
        }
        Err(e) => panic!("a handshake failed otherwise: {e}"),
    }
}

/// Sends `text` on `socket` and reads its echo: whether the socket still
/// carries messages both ways.
pub fn echoes(socket: &mut tungstenite::WebSocket<TcpStream>, text: &str) -> bool {
    if socket.send(tungstenite::Message::text(text)).is_err() {
        return false;
    }
    socket
        .read()
        .ok()
        .and_then(|m| m.into_text().ok())
        .is_some_and(|t| t.as_str() == text)
}
