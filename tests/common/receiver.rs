//! An HTTP receiver on 127.0.0.1 for webhook deliveries: it answers each request with the next
//! scripted status and keeps what it got.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::wait_until;

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: HashMap<String, String>,
    pub body: String,
}

impl Received {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).expect("a JSON body")
    }
}

/// An HTTP receiver on 127.0.0.1 that answers each request with the next scripted status
/// (200 once the script is used up) and keeps what it got.
pub struct Receiver {
    pub url: String,
    got: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    pub fn start(script: &[u16]) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
        let got = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(script.iter().copied().collect::<VecDeque<_>>()));
        let (kept, statuses) = (Arc::clone(&got), Arc::clone(&script));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let Some(received) = read_request(&stream) else {
                    continue;
                };
                let status = statuses.lock().expect("script").pop_front().unwrap_or(200);
                kept.lock().expect("kept").push(received);
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} Scripted\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
            }
        });
        Receiver { url, got }
    }

    pub fn received(&self) -> Vec<Received> {
        self.got.lock().expect("kept").clone()
    }

    pub fn wait_for(&self, n: usize) -> Vec<Received> {
        assert!(
            wait_until(Duration::from_secs(30), || self.received().len() >= n),
            "expected {n} requests, got {:?}",
            self.received()
        );
        self.received()
    }
}

fn read_request(stream: &std::net::TcpStream) -> Option<Received> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut headers = HashMap::new();
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        let (name, value) = trimmed.split_once(':')?;
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    let length: usize = headers.get("content-length")?.parse().ok()?;
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).ok()?;
    Some(Received {
        headers,
        body: String::from_utf8(body).ok()?,
    })
}
