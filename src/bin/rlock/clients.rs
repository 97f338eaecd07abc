//! Who a holder is: the connections whose `CLIENT SETNAME` carries the holder's client
//! id. A redis-rlock client names every connection `<name>:<client uuid>`; a holder whose
//! id no connection carries has lost its client (its process died), or was written by a
//! client that does not name its connections (Redisson's).

use std::collections::BTreeMap;

use redis::aio::MultiplexedConnection;

/// A client, as the server sees its connections.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Seen {
    /// The name the client gave itself (`ClientBuilder::name`), without its id.
    pub(crate) name: String,
    /// The address of its oldest connection.
    pub(crate) addr: String,
    /// The age of its oldest connection, in seconds.
    pub(crate) age_s: u64,
    /// How many connections carry its id.
    pub(crate) connections: usize,
}

/// The connected clients by id; `None` when the server refused `CLIENT LIST` (ACL).
pub(crate) type Clients = Option<BTreeMap<String, Seen>>;

pub(crate) async fn connected(conn: &mut MultiplexedConnection) -> Clients {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .ok()?;
    Some(parse(&list))
}

/// `CLIENT LIST`'s lines, `key=value` pairs apart by spaces, grouped by client id.
fn parse(list: &str) -> BTreeMap<String, Seen> {
    let mut by_id: BTreeMap<String, Seen> = BTreeMap::new();
    for line in list.lines() {
        let pairs: BTreeMap<&str, &str> = line
            .split(' ')
            .filter_map(|pair| pair.split_once('='))
            .collect();
        let Some((name, id)) = pairs.get("name").and_then(|n| split_name(n)) else {
            continue;
        };
        let seen = Seen {
            name: name.to_string(),
            addr: pairs.get("addr").unwrap_or(&"?").to_string(),
            age_s: pairs.get("age").and_then(|a| a.parse().ok()).unwrap_or(0),
            connections: 1,
        };
        by_id
            .entry(id.to_string())
            .and_modify(|known| {
                known.connections += 1;
                if seen.age_s > known.age_s {
                    (known.addr, known.age_s) = (seen.addr.clone(), seen.age_s);
                }
            })
            .or_insert(seen);
    }
    by_id
}

/// A connection name `<name>:<uuid>` as its two parts.
fn split_name(full: &str) -> Option<(&str, &str)> {
    let cut = full.len().checked_sub(37)?;
    let (name, id) = full.split_at_checked(cut)?;
    let id = id.strip_prefix(':')?;
    // The id has a holder field's shape once an owner is put after it.
    redis_rlock::protocol::is_holder_field(&format!("{id}:0")).then_some((name, id))
}

/// The client of a holder field, when one of its connections is open.
pub(crate) fn of_holder<'a>(clients: &'a Clients, field: &str) -> Option<&'a Seen> {
    clients.as_ref()?.get(field.get(..36)?)
}

/// One line on a holder's client, for text output.
pub(crate) fn describe(clients: &Clients, field: &str) -> String {
    match (clients, of_holder(clients, field)) {
        (None, _) => "client unknown (the server refused CLIENT LIST)".to_string(),
        (Some(_), Some(c)) => format!(
            "client {} at {}, connected {} s ({} connection{})",
            c.name,
            c.addr,
            c.age_s,
            c.connections,
            if c.connections == 1 { "" } else { "s" }
        ),
        (Some(_), None) => "client not connected: no connection carries its id now (its \
                            process died; or its connection dropped and it has sent nothing \
                            since; or it is not a redis-rlock client)"
            .to_string(),
    }
}

/// The same, for JSON output.
pub(crate) fn json(clients: &Clients, field: &str) -> serde_json::Value {
    match (clients, of_holder(clients, field)) {
        (None, _) => serde_json::json!({"known": false}),
        (Some(_), Some(c)) => serde_json::json!({
            "known": true, "connected": true, "name": c.name, "addr": c.addr,
            "age_s": c.age_s, "connections": c.connections,
        }),
        (Some(_), None) => serde_json::json!({"known": true, "connected": false}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_connections_by_client_id() {
        let id = "cd21d20e-0b8e-4b7e-9b53-2a3f4c5d6e7f";
        let list = format!(
            "id=3 addr=127.0.0.1:5000 name=billing:{id} age=9 idle=0\n\
             id=4 addr=127.0.0.1:5001 name=billing:{id} age=12 idle=0\n\
             id=5 addr=127.0.0.1:5002 name= age=1\n\
             id=6 addr=127.0.0.1:5003 name=other age=1\n"
        );
        let clients = Some(parse(&list));
        let seen = of_holder(&clients, &format!("{id}:thread-2")).unwrap();
        assert_eq!(seen.name, "billing");
        assert_eq!((seen.addr.as_str(), seen.age_s), ("127.0.0.1:5001", 12));
        assert_eq!(seen.connections, 2);
        let gone = "00000000-0000-0000-0000-000000000000:7";
        assert!(describe(&clients, gone).contains("not connected"));
    }
}
