//! An incremental HTTP/1.1 request parser: a state machine over the bytes a connection
//! receives, with no I/O of its own (the server feeds it; tests and the fuzzer feed it too).
//!
//! Everything it keeps is bounded by constants, never by what the peer declares: the request
//! line and headers together by [`MAX_HEAD_BYTES`] (and at most [`MAX_HEADERS`] fields), the
//! body by [`MAX_BODY_BYTES`]. A `Content-Length` above the body limit is refused as soon as
//! the head is complete, before a byte of the body is read; the body buffer then grows only
//! with bytes that arrived. `Transfer-Encoding` (chunked bodies) is refused with 501: every
//! client of this API sends a `Content-Length`.
//!
//! Lines may end in CRLF or a bare LF (RFC 9112 §2.2); empty lines before a request line are
//! skipped (§2.2); obsolete line folding is refused (§5.2).

use super::MAX_BODY_BYTES;

/// Largest request line plus headers, terminating empty line included.
pub const MAX_HEAD_BYTES: usize = 8192;
/// Most header fields in one request.
pub const MAX_HEADERS: usize = 64;

/// A request the parser refuses; the connection answers [`HttpError::status`] and closes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    #[error("the request line and headers are larger than the limit of {MAX_HEAD_BYTES} bytes")]
    HeadTooLarge,
    #[error("the request has more than {MAX_HEADERS} header fields")]
    TooManyHeaders,
    #[error("malformed request line")]
    BadRequestLine,
    #[error("unsupported HTTP version (HTTP/1.0 and HTTP/1.1 are served)")]
    Version,
    #[error("malformed header field")]
    BadHeader,
    #[error("invalid Content-Length")]
    BadContentLength,
    #[error("the request body is larger than the limit of {MAX_BODY_BYTES} bytes")]
    BodyTooLarge,
    #[error("Transfer-Encoding is not supported: send the body with a Content-Length")]
    TransferEncoding,
    #[error("only `Expect: 100-continue` is supported")]
    Expectation,
}

impl HttpError {
    /// The status code to answer.
    pub fn status(&self) -> u16 {
        match self {
            HttpError::HeadTooLarge | HttpError::TooManyHeaders => 431,
            HttpError::BadRequestLine | HttpError::BadHeader | HttpError::BadContentLength => 400,
            HttpError::Version => 505,
            HttpError::BodyTooLarge => 413,
            HttpError::TransferEncoding => 501,
            HttpError::Expectation => 417,
        }
    }
}

/// The HTTP version of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// HTTP/1.0: the connection closes after the answer unless the client asks otherwise.
    Http10,
    /// HTTP/1.1: the connection stays open unless the client says `Connection: close`.
    Http11,
}

impl Version {
    /// As written on a request or status line.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        }
    }
}

/// A complete request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The method, as sent (case-sensitive).
    pub method: String,
    /// The request target, as sent (not percent-decoded).
    pub target: String,
    /// The version.
    pub version: Version,
    /// The header fields in order: (name in lower case, value without surrounding whitespace).
    pub headers: Vec<(String, String)>,
    /// The body (`Content-Length` bytes, at most [`MAX_BODY_BYTES`]).
    pub body: Vec<u8>,
}

impl Request {
    /// The value of the first header field called `name` (give it in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the connection may carry another request after this one.
    pub fn keep_alive(&self) -> bool {
        let has = |token: &str| {
            self.headers
                .iter()
                .filter(|(n, _)| n == "connection")
                .flat_map(|(_, v)| v.split(','))
                .any(|t| t.trim().eq_ignore_ascii_case(token))
        };
        match self.version {
            Version::Http11 => !has("close"),
            Version::Http10 => has("keep-alive") && !has("close"),
        }
    }

    /// Whether the client accepts `text/plain` (the Prometheus form of the metrics).
    pub fn accepts_text(&self) -> bool {
        self.headers
            .iter()
            .any(|(n, v)| n == "accept" && v.contains("text/plain"))
    }

    /// The request as bytes a client would send (for tests and the fuzzer's round trip).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!(
            "{} {} {}\r\n",
            self.method,
            self.target,
            self.version.as_str()
        );
        for (name, value) in &self.headers {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        out.push_str("\r\n");
        let mut out = out.into_bytes();
        out.extend_from_slice(&self.body);
        out
    }
}

/// What a call to [`Parser::feed`] produced besides consuming bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The head announced a body with `Expect: 100-continue`: answer `100 Continue` now.
    Continue,
    /// A complete request; the parser is ready for the next one.
    Request(Request),
}

/// The result of one [`Parser::feed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// How many of the bytes given were consumed (the rest belong to a later call).
    pub consumed: usize,
    /// What became complete, if anything.
    pub event: Option<Event>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Collecting the request line and headers.
    Head,
    /// Collecting `remaining` more body bytes for `request`.
    Body { request: Request, remaining: usize },
}

/// The parser of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parser {
    state: State,
    /// The head so far (at most [`MAX_HEAD_BYTES`]).
    head: Vec<u8>,
    /// Where the line being collected starts in `head`.
    line_start: usize,
}

impl Default for Parser {
    fn default() -> Self {
        Parser::new()
    }
}

impl Parser {
    /// A parser waiting for a request line.
    pub fn new() -> Parser {
        Parser {
            state: State::Head,
            head: Vec::new(),
            line_start: 0,
        }
    }

    /// True when no byte of a request has been received (between requests).
    pub fn is_idle(&self) -> bool {
        self.state == State::Head && self.head.is_empty()
    }

    /// Bytes held for the request in progress (bounded by the limits).
    pub fn buffered(&self) -> usize {
        match &self.state {
            State::Head => self.head.len(),
            State::Body { request, .. } => request.body.len(),
        }
    }

    /// Consumes a prefix of `input`. Stops after a complete head that expects `100 Continue`
    /// and after a complete request, so that the caller can answer before feeding the rest.
    /// After an error the parser must not be fed again (the connection closes).
    pub fn feed(&mut self, input: &[u8]) -> Result<Step, HttpError> {
        match &mut self.state {
            State::Head => self.feed_head(input),
            State::Body { request, remaining } => {
                let n = input.len().min(*remaining);
                request.body.extend_from_slice(&input[..n]);
                *remaining -= n;
                let event = if *remaining == 0 { self.finish() } else { None };
                Ok(Step { consumed: n, event })
            }
        }
    }

    fn feed_head(&mut self, input: &[u8]) -> Result<Step, HttpError> {
        for (i, &byte) in input.iter().enumerate() {
            if self.head.len() >= MAX_HEAD_BYTES {
                return Err(HttpError::HeadTooLarge);
            }
            self.head.push(byte);
            if byte != b'\n' {
                continue;
            }
            let line = trim_cr(&self.head[self.line_start..self.head.len() - 1]);
            if !line.is_empty() {
                self.line_start = self.head.len();
                continue;
            }
            if self.line_start == 0 {
                // An empty line before the request line: skipped.
                self.head.clear();
                continue;
            }
            let consumed = i + 1;
            let (request, length, expect_continue) = parse_head(&self.head)?;
            self.head = Vec::new();
            self.line_start = 0;
            if length == 0 {
                return Ok(Step {
                    consumed,
                    event: Some(Event::Request(request)),
                });
            }
            self.state = State::Body {
                request,
                remaining: length,
            };
            let event = expect_continue.then_some(Event::Continue);
            return Ok(Step { consumed, event });
        }
        Ok(Step {
            consumed: input.len(),
            event: None,
        })
    }

    /// Ends the body state: the request is complete.
    fn finish(&mut self) -> Option<Event> {
        match std::mem::replace(&mut self.state, State::Head) {
            State::Body { request, .. } => Some(Event::Request(request)),
            State::Head => None,
        }
    }
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// A `tchar` of RFC 9110 §5.6.2 (method and field names).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parses a complete head (ending with its empty line): the request without its body, the
/// body length, and whether the client waits for `100 Continue`.
fn parse_head(head: &[u8]) -> Result<(Request, usize, bool), HttpError> {
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(trim_cr)
        .take_while(|l| !l.is_empty());
    let request_line = lines.next().ok_or(HttpError::BadRequestLine)?;
    let mut parts = request_line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::BadRequestLine);
    };
    if method.is_empty() || !method.iter().copied().all(is_tchar) {
        return Err(HttpError::BadRequestLine);
    }
    if target.is_empty() || !target.iter().all(|b| b.is_ascii_graphic()) {
        return Err(HttpError::BadRequestLine);
    }
    let version = match version {
        b"HTTP/1.1" => Version::Http11,
        b"HTTP/1.0" => Version::Http10,
        v if v.starts_with(b"HTTP/") => return Err(HttpError::Version),
        _ => return Err(HttpError::BadRequestLine),
    };
    let mut headers = Vec::new();
    for line in lines {
        if headers.len() == MAX_HEADERS {
            return Err(HttpError::TooManyHeaders);
        }
        headers.push(parse_header(line)?);
    }
    let (length, expect_continue) = body_framing(&headers, version)?;
    // Both are ASCII graphic by now.
    let request = Request {
        method: String::from_utf8_lossy(method).into_owned(),
        target: String::from_utf8_lossy(target).into_owned(),
        version,
        headers,
        body: Vec::new(),
    };
    Ok((request, length, expect_continue))
}

/// One header line: its name (lower case) and its value (trimmed).
fn parse_header(line: &[u8]) -> Result<(String, String), HttpError> {
    let colon = line
        .iter()
        .position(|&b| b == b':')
        .ok_or(HttpError::BadHeader)?;
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    // Also refuses obsolete line folding (a line starting with whitespace).
    if name.is_empty() || !name.iter().copied().all(is_tchar) {
        return Err(HttpError::BadHeader);
    }
    let value = value.trim_ascii();
    if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return Err(HttpError::BadHeader);
    }
    let value = std::str::from_utf8(value).map_err(|_| HttpError::BadHeader)?;
    // Both are ASCII (tchars) and UTF-8 by now.
    let name = String::from_utf8_lossy(name).to_ascii_lowercase();
    Ok((name, value.to_owned()))
}

/// How the body is framed: its length (Content-Length, 0 without), and whether the client
/// waits for `100 Continue`. Chunked bodies are refused.
fn body_framing(
    headers: &[(String, String)],
    version: Version,
) -> Result<(usize, bool), HttpError> {
    let mut length: Option<usize> = None;
    let mut expect_continue = false;
    for (name, value) in headers {
        match name.as_str() {
            "transfer-encoding" => return Err(HttpError::TransferEncoding),
            "content-length" => {
                if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(HttpError::BadContentLength);
                }
                // Past the limit whatever its digits: refused without parsing a huge number.
                let n = value
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n <= MAX_BODY_BYTES)
                    .ok_or(HttpError::BodyTooLarge)?;
                if length.is_some_and(|l| l != n) {
                    return Err(HttpError::BadContentLength);
                }
                length = Some(n);
            }
            "expect" => {
                if !value.eq_ignore_ascii_case("100-continue") {
                    return Err(HttpError::Expectation);
                }
                expect_continue = version == Version::Http11;
            }
            _ => {}
        }
    }
    Ok((length.unwrap_or(0), expect_continue))
}

/// The reason phrase of the status codes the API sends.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        417 => "Expectation Failed",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// A response's bytes: status line, `Content-Type` and `Content-Length` (neither for 204),
/// the `extra` header fields, `Connection: close` when `close`, and the body.
pub fn response_bytes(
    version: Version,
    status: u16,
    content_type: &str,
    extra: &[(&str, &str)],
    close: bool,
    body: &[u8],
) -> Vec<u8> {
    let mut head = format!("{} {status} {}\r\n", version.as_str(), reason(status));
    head.push_str("Server: vmm\r\n");
    if status != 204 {
        head.push_str(&format!(
            "Content-Type: {content_type}\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    for (name, value) in extra {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if close {
        head.push_str("Connection: close\r\n");
    } else if version == Version::Http10 {
        head.push_str("Connection: keep-alive\r\n");
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    if status != 204 {
        out.extend_from_slice(body);
    }
    out
}

#[cfg(test)]
mod tests;
