//! Redis Cluster's slots: the slot of a key (CRC16 of its hash tag, as
//! Redis computes it) and the slot → primary map read from `CLUSTER SLOTS`.

/// One range of slots and the primary (`host:port`) that serves it.
#[derive(Debug, Clone)]
pub(super) struct SlotRange {
    pub(super) start: u16,
    pub(super) end: u16,
    pub(super) node: String,
}

/// Parses `CLUSTER SLOTS`: `[[start, end, [host, port, id], replicas…], …]`.
pub(super) fn parse_cluster_slots(value: &redis::Value) -> Vec<SlotRange> {
    use redis::Value;
    let Value::Array(entries) = value else {
        return Vec::new();
    };
    let mut ranges = Vec::new();
    for entry in entries {
        let Value::Array(parts) = entry else { continue };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            continue;
        };
        let host = match primary.first() {
            Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
            Some(Value::SimpleString(text)) => text.clone(),
            _ => continue,
        };
        let Some(Value::Int(port)) = primary.get(1) else {
            continue;
        };
        ranges.push(SlotRange {
            start: *start as u16,
            end: *end as u16,
            node: format!("{host}:{port}"),
        });
    }
    ranges.sort_by_key(|r| r.start);
    ranges
}

/// The Redis Cluster slot of `key` (CRC16/XMODEM of its hash tag, mod 16384).
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(tagged) % 16384
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= (byte as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // Values from CLUSTER KEYSLOT on a real cluster.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"sluice:{login:per-user:u1}"), 12192);
        assert_eq!(key_slot(b"login:per-user:u1"), 12192);
        assert_eq!(key_slot(b"{}x"), key_slot(b"{}x"));
        assert_eq!(key_slot(b"a{}b"), crc16(b"a{}b") % 16384);
    }
}
