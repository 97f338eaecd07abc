//! A pub/sub connection to the server, spoken in raw RESP2 so that its messages can be
//! read up to a fence: a `PING` sent after a step is answered after every message
//! published before it, so no read has to wait for a timeout.

use std::collections::BTreeSet;
use std::io::{BufReader, Write};
use std::net::TcpStream;

use redis::Value;

/// A message as heard: channel, payload, and whether it came by `SSUBSCRIBE`.
pub type Heard = (Vec<u8>, Vec<u8>, bool);

pub struct Subscriber {
    out: TcpStream,
    input: BufReader<TcpStream>,
    parser: redis::Parser,
    /// (channel, sharded) pairs this connection listens on.
    pub channels: BTreeSet<(Vec<u8>, bool)>,
}

impl Subscriber {
    pub fn connect(port: u16) -> Subscriber {
        let out = TcpStream::connect(("127.0.0.1", port)).expect("connect a subscriber");
        let input = BufReader::new(out.try_clone().expect("clone the stream"));
        Subscriber {
            out,
            input,
            parser: redis::Parser::new(),
            channels: BTreeSet::new(),
        }
    }

    fn send(&mut self, args: &[&[u8]]) {
        let mut cmd = redis::cmd(std::str::from_utf8(args[0]).expect("a command name"));
        for a in &args[1..] {
            cmd.arg(*a);
        }
        self.out
            .write_all(&cmd.get_packed_command())
            .expect("write to a subscriber");
    }

    fn read(&mut self) -> Value {
        self.parser
            .parse_value(&mut self.input)
            .expect("read from a subscriber")
    }

    /// Subscribes (`on`) or unsubscribes `channel`, sharded or not, and waits for the
    /// server to confirm. Call only with no message pending (after [`Self::drain`]).
    pub fn set(&mut self, channel: &[u8], sharded: bool, on: bool) {
        let verb: &[u8] = match (sharded, on) {
            (false, true) => b"SUBSCRIBE",
            (false, false) => b"UNSUBSCRIBE",
            (true, true) => b"SSUBSCRIBE",
            (true, false) => b"SUNSUBSCRIBE",
        };
        self.send(&[verb, channel]);
        let confirm = self.read();
        assert!(
            matches!(&confirm, Value::Array(items) if items.len() == 3),
            "a (un)subscribe confirmation, not {confirm:?}"
        );
        let key = (channel.to_vec(), sharded);
        if on {
            self.channels.insert(key);
        } else {
            self.channels.remove(&key);
        }
    }

    /// Every message heard since the last drain, in order.
    pub fn drain(&mut self) -> Vec<Heard> {
        self.send(&[b"PING"]);
        let mut heard = Vec::new();
        loop {
            match self.read() {
                // Outside subscribed mode a PING is answered +PONG.
                Value::SimpleString(s) if s == "PONG" => return heard,
                Value::Array(items) => match message(&items) {
                    Some(m) => heard.push(m),
                    None => return heard,
                },
                other => panic!("a subscriber read {other:?}"),
            }
        }
    }
}

/// A `message`/`smessage` push, or `None` for the PING's `pong`.
fn message(items: &[Value]) -> Option<Heard> {
    let bytes = |v: &Value| match v {
        Value::BulkString(b) => b.clone(),
        other => panic!("a subscriber read {other:?} in a message"),
    };
    let kind = bytes(&items[0]);
    match kind.as_slice() {
        b"pong" => None,
        b"message" => Some((bytes(&items[1]), bytes(&items[2]), false)),
        b"smessage" => Some((bytes(&items[1]), bytes(&items[2]), true)),
        other => panic!(
            "a subscriber read a {:?} push",
            other.escape_ascii().to_string()
        ),
    }
}
