//! How `rlock` reaches Redis: one connection to a node, and on a cluster the masters and
//! the one that owns a name's slot.

use std::time::Duration;

use redis::aio::MultiplexedConnection;

pub(crate) async fn connect(url: &str) -> redis::RedisResult<MultiplexedConnection> {
    connect_client(&redis::Client::open(url)?).await
}

pub(crate) async fn connect_client(
    client: &redis::Client,
) -> redis::RedisResult<MultiplexedConnection> {
    let cfg = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(3)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    client
        .get_multiplexed_async_connection_with_config(&cfg)
        .await
}

/// The cluster's masters (`redis://host:port`) and the slot ranges each serves, from
/// the first node that answers `CLUSTER SLOTS`.
pub(crate) async fn cluster_masters(
    nodes: &[String],
) -> Result<Vec<(String, Vec<(u16, u16)>)>, String> {
    for node in nodes {
        let Ok(mut conn) = connect(&format!("redis://{node}")).await else {
            continue;
        };
        let Ok(slots) = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async::<Vec<redis::Value>>(&mut conn)
            .await
        else {
            continue;
        };
        let mut masters: Vec<(String, Vec<(u16, u16)>)> = Vec::new();
        for range in slots {
            let redis::Value::Array(items) = range else {
                continue;
            };
            let (Some(lo), Some(hi), Some(redis::Value::Array(master))) =
                (items.first(), items.get(1), items.get(2))
            else {
                continue;
            };
            let lo: u16 = redis::from_redis_value(lo.clone()).map_err(|e| e.to_string())?;
            let hi: u16 = redis::from_redis_value(hi.clone()).map_err(|e| e.to_string())?;
            let host: String =
                redis::from_redis_value(master[0].clone()).map_err(|e| e.to_string())?;
            let port: u16 =
                redis::from_redis_value(master[1].clone()).map_err(|e| e.to_string())?;
            let url = format!("redis://{host}:{port}");
            match masters.iter_mut().find(|m| m.0 == url) {
                Some(m) => m.1.push((lo, hi)),
                None => masters.push((url, vec![(lo, hi)])),
            }
        }
        return Ok(masters);
    }
    Err(format!("no node of {nodes:?} answered CLUSTER SLOTS"))
}

/// The master that owns `name`'s slot.
pub(crate) async fn slot_master(nodes: &[String], name: &str) -> Result<String, String> {
    let masters = cluster_masters(nodes).await?;
    let first = masters.first().ok_or("the cluster has no master")?;
    let mut conn = connect(&first.0).await.map_err(|e| e.to_string())?;
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(name)
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    masters
        .iter()
        .find(|(_, ranges)| ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&slot)))
        .map(|(url, _)| url.clone())
        .ok_or_else(|| format!("no master serves slot {slot}"))
}
