//! The request parser, fed whole and byte by byte.

use super::*;

/// Feeds `input` in chunks of `chunk` bytes; returns the events and the first error.
fn run(input: &[u8], chunk: usize) -> (Vec<Event>, Option<HttpError>) {
    let mut parser = Parser::new();
    let mut events = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        let take = rest.len().min(chunk);
        let mut piece = &rest[..take];
        while !piece.is_empty() {
            match parser.feed(piece) {
                Ok(step) => {
                    assert!(step.consumed <= piece.len());
                    assert!(step.consumed > 0 || step.event.is_some());
                    piece = &piece[step.consumed..];
                    events.extend(step.event);
                }
                Err(e) => return (events, Some(e)),
            }
        }
        rest = &rest[take..];
    }
    (events, None)
}

fn requests(input: &[u8]) -> Vec<Request> {
    let mut all = None;
    for chunk in [1, 2, 7, 4096] {
        let (events, error) = run(input, chunk);
        assert_eq!(error, None, "chunk {chunk}");
        let requests: Vec<Request> = events
            .into_iter()
            .filter_map(|e| match e {
                Event::Request(r) => Some(r),
                Event::Continue => None,
            })
            .collect();
        if let Some(all) = &all {
            assert_eq!(all, &requests, "chunk {chunk}");
        }
        all = Some(requests);
    }
    all.unwrap_or_default()
}

fn error(input: &[u8]) -> HttpError {
    let (_, e) = run(input, 4096);
    let e = e.expect("an error");
    assert_eq!(run(input, 1).1, Some(e.clone()), "byte by byte");
    e
}

#[test]
fn a_request_with_a_body_and_pipelined_requests() {
    let input = b"PUT /actions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\n\nGET /metrics HTTP/1.0\r\nAccept: text/plain\r\n\r\n";
    let r = requests(input);
    assert_eq!(r.len(), 3);
    assert_eq!(
        (r[0].method.as_str(), r[0].target.as_str()),
        ("PUT", "/actions")
    );
    assert_eq!(r[0].body, b"hello");
    assert_eq!(r[0].header("host"), Some("x"));
    assert!(r[0].keep_alive());
    assert_eq!(r[1].target, "/");
    assert!(r[1].body.is_empty());
    assert_eq!(r[2].version, Version::Http10);
    assert!(!r[2].keep_alive());
    assert!(r[2].accepts_text());
}

#[test]
fn connection_header_and_round_trip() {
    let r = &requests(b"GET / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n")[0];
    assert!(!r.keep_alive());
    let r = &requests(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")[0];
    assert!(r.keep_alive());
    let r = &requests(b"\r\n\r\nPATCH /x?y HTTP/1.1\r\nA:  b c \r\nContent-Length: 2\r\n\r\n{}")[0];
    assert_eq!(r.header("a"), Some("b c"));
    assert_eq!(requests(&r.to_bytes()), vec![r.clone()]);
}

#[test]
fn expect_continue_comes_before_the_body() {
    let (events, e) = run(
        b"PUT /a HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}",
        4096,
    );
    assert_eq!(e, None);
    assert_eq!(events[0], Event::Continue);
    assert!(matches!(&events[1], Event::Request(r) if r.body == b"{}"));
    assert_eq!(
        error(b"PUT /a HTTP/1.1\r\nExpect: magic\r\n\r\n"),
        HttpError::Expectation
    );
}

#[test]
fn malformed_requests_get_their_status() {
    let cases: &[(&[u8], u16)] = &[
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /\r\n\r\n", 400),
        (b"GET  / HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1 x\r\n\r\n", 400),
        (b"G(T / HTTP/1.1\r\n\r\n", 400),
        (b"GET /\x01 HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (b"GET / FTP/1.0\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nA b: c\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nA: \x00\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nA: \xff\r\n\r\n", 400),
        (b"PUT / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"PUT / HTTP/1.1\r\nContent-Length: +1\r\n\r\n", 400),
        (b"PUT / HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\n", 400),
        (b"PUT / HTTP/1.1\r\nContent-Length:\r\n\r\n", 400),
        (
            b"PUT / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            400,
        ),
        (b"PUT / HTTP/1.1\r\nContent-Length: 51201\r\n\r\n", 413),
        (
            b"PUT / HTTP/1.1\r\nContent-Length: 1099511627776\r\n\r\n",
            413,
        ),
        (
            b"PUT / HTTP/1.1\r\nContent-Length: 99999999999999999999999999999\r\n\r\n",
            413,
        ),
        (b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
    ];
    for &(input, status) in cases {
        assert_eq!(
            error(input).status(),
            status,
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn the_body_limit_is_inclusive() {
    let body = vec![b'x'; MAX_BODY_BYTES];
    let mut input =
        format!("PUT / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    input.extend_from_slice(&body);
    assert_eq!(requests(&input)[0].body.len(), MAX_BODY_BYTES);
}

#[test]
fn a_huge_header_line_is_refused_at_the_limit_without_buffering_it() {
    let mut parser = Parser::new();
    parser.feed(b"GET / HTTP/1.1\r\nX-Big: ").expect("a start");
    let chunk = [b'a'; 4096];
    let mut fed = 0;
    let e = loop {
        match parser.feed(&chunk) {
            Ok(_) => fed += chunk.len(),
            Err(e) => break e,
        }
        assert!(fed < 1 << 20, "never refused");
        assert!(parser.buffered() <= MAX_HEAD_BYTES);
    };
    assert_eq!(e, HttpError::HeadTooLarge);
    assert_eq!(e.status(), 431);
    assert!(fed < 2 * MAX_HEAD_BYTES);
}

#[test]
fn the_head_limit_is_inclusive_and_header_count_is_bounded() {
    let line = "GET / HTTP/1.1\r\n";
    let filler = "X: ".len() + "\r\n".len() + "\r\n".len();
    let exact = format!(
        "{line}X: {}\r\n\r\n",
        "a".repeat(MAX_HEAD_BYTES - line.len() - filler)
    );
    assert_eq!(exact.len(), MAX_HEAD_BYTES);
    assert_eq!(requests(exact.as_bytes()).len(), 1);
    let over = format!(
        "{line}X: {}\r\n\r\n",
        "a".repeat(MAX_HEAD_BYTES - line.len() - filler + 1)
    );
    assert_eq!(error(over.as_bytes()), HttpError::HeadTooLarge);

    let many = |n: usize| {
        let mut s = line.to_owned();
        for i in 0..n {
            s.push_str(&format!("H{i}: v\r\n"));
        }
        s.push_str("\r\n");
        s
    };
    assert_eq!(requests(many(MAX_HEADERS).as_bytes()).len(), 1);
    assert_eq!(
        error(many(MAX_HEADERS + 1).as_bytes()),
        HttpError::TooManyHeaders
    );
}

#[test]
fn responses() {
    let r = response_bytes(Version::Http11, 204, "application/json", &[], false, b"x");
    assert_eq!(r, b"HTTP/1.1 204 No Content\r\nServer: vmm\r\n\r\n");
    let r = response_bytes(
        Version::Http10,
        405,
        "application/json",
        &[("Allow", "GET")],
        true,
        b"{}",
    );
    let text = String::from_utf8(r).unwrap();
    assert!(
        text.starts_with("HTTP/1.0 405 Method Not Allowed\r\n"),
        "{text}"
    );
    assert!(text.contains("\r\nContent-Length: 2\r\n"), "{text}");
    assert!(text.contains("\r\nAllow: GET\r\n"), "{text}");
    assert!(text.ends_with("Connection: close\r\n\r\n{}"), "{text}");
}
