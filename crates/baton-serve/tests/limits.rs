//! The limits on a real listener, with real clients that misbehave: one
//! that sends its headers a byte at a time, one that connects and says
//! nothing, more clients than the cap, and a shutdown with a request in
//! flight.

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use baton_serve::{Limits, serve};

/// Serves a router that answers `/` with the client's address and `/slow`
/// after `gate` opens, on a thread of its own; returns the address and the
/// shutdown trigger.
fn start(
    limits: Limits,
    gate: std::sync::Arc<tokio::sync::Notify>,
) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            let app = Router::new()
                .route(
                    "/",
                    get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
                        peer.ip().to_string()
                    }),
                )
                .route(
                    "/slow",
                    get(move || async move {
                        gate.notified().await;
                        "done"
                    }),
                );
            serve(listener, app, limits, async {
                let _ = stop_rx.await;
            })
            .await;
        });
    });
    (addr_rx.recv().unwrap(), stop_tx)
}

/// Reads until the server closes the connection (or `limit` passes):
/// what it sent, and whether it closed.
fn read_until_closed(stream: &mut std::net::TcpStream, limit: Duration) -> (String, bool) {
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return (String::from_utf8_lossy(&got).into_owned(), true);
            }
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), false),
        }
    }
}

const QUICK: Limits = Limits {
    header_read_timeout: Duration::from_millis(500),
    max_connections: 2,
};

#[test]
fn headers_sent_a_byte_at_a_time_close_the_connection_at_the_timeout() {
    let (addr, _stop) = start(QUICK, Default::default());
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    let started = Instant::now();
    let request = b"GET / HTTP/1.1\r\nhost: x\r\nx-padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut closed = false;
    for byte in request {
        // A slow client, not a synchronisation: one byte every 100 ms.
        std::thread::sleep(Duration::from_millis(100));
        if stream.write_all(&[*byte]).is_err() {
            closed = true;
            break;
        }
        if started.elapsed() > Duration::from_secs(5) {
            break;
        }
    }
    if !closed {
        let (answer, gone) = read_until_closed(&mut stream, Duration::from_secs(5));
        assert!(gone, "the connection stayed open: {answer:?}");
        assert!(!answer.contains("200 OK"), "{answer}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "closed after {:?}, not at the 500 ms timeout",
        started.elapsed()
    );
}

#[test]
fn an_idle_connection_is_closed_and_a_prompt_one_is_served_with_its_address() {
    let (addr, _stop) = start(QUICK, Default::default());
    let mut idle = std::net::TcpStream::connect(addr).unwrap();
    let (_, closed) = read_until_closed(&mut idle, Duration::from_secs(5));
    assert!(closed, "a connection that said nothing stayed open");

    let mut prompt = std::net::TcpStream::connect(addr).unwrap();
    prompt
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let (answer, closed) = read_until_closed(&mut prompt, Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("127.0.0.1"), "{answer}");
    assert!(closed, "the kept-alive connection was closed once idle");
}

#[test]
fn beyond_the_cap_a_connection_waits_until_one_closes() {
    let limits = Limits {
        header_read_timeout: Duration::from_secs(30),
        max_connections: 2,
    };
    let (addr, _stop) = start(limits, Default::default());
    let mut first = std::net::TcpStream::connect(addr).unwrap();
    let mut second = std::net::TcpStream::connect(addr).unwrap();
    for held in [&mut first, &mut second] {
        held.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        held.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 256];
        let n = held.read(&mut buf).unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    }
    // Both kept alive: the third is connected by the kernel but not served.
    let mut third = std::net::TcpStream::connect(addr).unwrap();
    third
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let (answer, _) = read_until_closed(&mut third, Duration::from_millis(700));
    assert_eq!(answer, "", "served beyond the cap");
    drop(first);
    let (answer, closed) = read_until_closed(&mut third, Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 200") && closed, "{answer:?}");
}

#[test]
fn shutdown_answers_the_request_in_flight_then_closes() {
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let (addr, stop) = start(Limits::DEFAULT, gate.clone());
    let mut slow = std::net::TcpStream::connect(addr).unwrap();
    slow.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    // The request is in the handler once the server has read it: a second
    // connection's answer shows the server is past it.
    let mut probe = std::net::TcpStream::connect(addr).unwrap();
    probe
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let (answer, _) = read_until_closed(&mut probe, Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    stop.send(()).unwrap();
    gate.notify_one();
    let (answer, closed) = read_until_closed(&mut slow, Duration::from_secs(5));
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("done"),
        "{answer:?}"
    );
    assert!(closed, "the connection closed after its answer");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the listener closed"
    );
}
