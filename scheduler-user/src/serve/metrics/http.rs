//! The little HTTP/1.x the metrics endpoint speaks: find the end of a request head, route its
//! request line, and write a complete response that closes the connection. Pure: the
//! sockets, limits and timeouts are the caller's.

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// `GET /metrics` (or `HEAD`, which gets the headers only).
    Metrics {
        /// A `HEAD` request: no body.
        head_only: bool,
    },
    /// Another path.
    NotFound,
    /// `/metrics` with a method other than `GET` or `HEAD`.
    MethodNotAllowed,
    /// Not an HTTP request line.
    BadRequest,
}

/// The path of the metrics.
pub(crate) const METRICS_PATH: &str = "/metrics";

/// The length of the request head in `buffer` (up to and including its blank line), once it
/// is all there.
#[must_use]
pub(crate) fn head_length(buffer: &[u8]) -> Option<usize> {
    let crlf = buffer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| at + 4);
    // Some clients (and people typing into netcat) end lines with a bare newline.
    let lf = buffer
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|at| at + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Routes a request by its first line. The query string is ignored.
#[must_use]
pub(crate) fn route(head: &[u8]) -> Route {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let Ok(line) = std::str::from_utf8(&head[..line_end]) else {
        return Route::BadRequest;
    };
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Route::BadRequest;
    };
    if method.is_empty() || !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Route::BadRequest;
    }
    let path = target.split('?').next().unwrap_or(target);
    if path != METRICS_PATH {
        return Route::NotFound;
    }
    match method {
        "GET" => Route::Metrics { head_only: false },
        "HEAD" => Route::Metrics { head_only: true },
        _ => Route::MethodNotAllowed,
    }
}

/// The credentials of the request's `Authorization: Bearer` header, if it has one.
#[must_use]
pub(crate) fn bearer_token(head: &[u8]) -> Option<&[u8]> {
    head.split(|&b| b == b'\n').skip(1).find_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = line.iter().position(|&b| b == b':')?;
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if !name.eq_ignore_ascii_case(b"authorization") {
            return None;
        }
        let scheme = value.get(..7)?;
        scheme
            .eq_ignore_ascii_case(b"bearer ")
            .then(|| value[7..].trim_ascii())
    })
}

/// The reason phrase of the statuses the endpoint answers with.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    }
}

/// A whole response that closes the connection. `head_only` leaves the body out but keeps its
/// length, as `HEAD` requires.
#[must_use]
pub(crate) fn response(status: u16, content_type: &str, body: &[u8], head_only: bool) -> Vec<u8> {
    let allow = match status {
        401 => "WWW-Authenticate: Bearer realm=\"abissd\"\r\n",
        405 => "Allow: GET, HEAD\r\n",
        _ => "",
    };
    let mut bytes = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        reason(status),
        body.len()
    )
    .into_bytes();
    if !head_only {
        bytes.extend_from_slice(body);
    }
    bytes
}

/// A plain-text error response: the status and one line saying what to do.
#[must_use]
pub(crate) fn error(status: u16, message: &str) -> Vec<u8> {
    response(
        status,
        "text/plain; charset=utf-8",
        format!("{message}\n").as_bytes(),
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_by_path_then_method() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(
            route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Route::Metrics { head_only: false }
        );
        assert_eq!(
            route(b"HEAD /metrics HTTP/1.1\r\n\r\n"),
            Route::Metrics { head_only: true }
        );
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Route::MethodNotAllowed
        );
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route(b"POST /other HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route(b"GET /metrics/ HTTP/1.1\r\n\r\n"), Route::NotFound);
        for bad in [
            &b"GET /metrics\r\n\r\n"[..],
            b"\r\n\r\n",
            b"GET metrics HTTP/1.1\r\n",
            b"GET /metrics SPDY/3\r\n",
            b"\xff /metrics HTTP/1.1\r\n",
        ] {
            assert_eq!(route(bad), Route::BadRequest, "{bad:?}");
        }
    }

    #[test]
    fn the_bearer_token_is_found_in_any_case_and_only_in_its_header() {
        let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nauthorization:  Bearer  abc \r\n\r\n";
        assert_eq!(bearer_token(head), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"GET /metrics HTTP/1.1\r\n\r\n"), None);
        assert_eq!(
            bearer_token(b"GET /metrics HTTP/1.1\r\nAuthorization: Basic abc\r\n\r\n"),
            None
        );
        // The request line is no header.
        assert_eq!(bearer_token(b"Authorization: Bearer abc\r\n\r\n"), None);
        let refused = String::from_utf8(error(401, "a token")).unwrap();
        assert!(
            refused.contains("401 Unauthorized\r\n")
                && refused.contains("WWW-Authenticate: Bearer")
        );
    }

    #[test]
    fn a_head_ends_at_its_blank_line() {
        assert_eq!(head_length(b"GET / HTTP/1.1\r\nA: b\r\n"), None);
        assert_eq!(head_length(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
        assert_eq!(head_length(b"GET / HTTP/1.0\n\n"), Some(16));
    }

    #[test]
    fn responses_carry_their_length_and_close() {
        let text = String::from_utf8(response(200, "text/plain", b"abc", false)).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("Content-Length: 3\r\n") && text.contains("Connection: close\r\n"));
        assert!(text.ends_with("\r\n\r\nabc"));
        let head = String::from_utf8(response(200, "text/plain", b"abc", true)).unwrap();
        assert!(head.contains("Content-Length: 3\r\n") && head.ends_with("\r\n\r\n"));
        let refused = String::from_utf8(error(405, "only GET")).unwrap();
        assert!(refused.contains("405 Method Not Allowed") && refused.contains("Allow: GET, HEAD"));
    }
}
