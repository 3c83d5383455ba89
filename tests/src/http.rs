//! The HTTP a test speaks to `abissd --metrics`: one request on a fresh connection, read to
//! its end (the server closes after its answer).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// A port nobody listens on now (the kernel's choice, released at once).
#[must_use]
pub fn free_address() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("its address")
}

/// Sends `request` as is and reads the whole answer: the status and the text.
#[must_use]
pub fn exchange(address: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    stream.write_all(request).expect("send");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    (status_of(&text), text)
}

/// The status of an HTTP answer.
#[must_use]
pub fn status_of(text: &str) -> u16 {
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text:?}"))
}

/// `GET path` with `headers` (each ending in CRLF): the status and the body.
#[must_use]
pub fn get_with(address: SocketAddr, path: &str, headers: &str) -> (u16, String) {
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {address}\r\n{headers}Connection: close\r\n\r\n");
    let (status, text) = exchange(address, request.as_bytes());
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// `GET path`: the status and the body.
#[must_use]
pub fn get(address: SocketAddr, path: &str) -> (u16, String) {
    get_with(address, path, "")
}
