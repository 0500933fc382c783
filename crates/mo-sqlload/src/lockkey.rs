//! The keys of the lock tables a DML statement on a user table needs (kernel v1.2.4).
//!
//! The TN's allocator binds each `(group, table)` to the CN that asked first. A DML statement
//! (and `SELECT ... FOR UPDATE`) on `db.t` takes two kinds of locks:
//! - its rows, in the lock table `(0, rel_id)`: `LockTarget{TableId: tableDef.TblId}` in
//!   `pkg/sql/plan/build_dml_util.go` / `query_builder.go`, group left 0 by
//!   `lockop.DefaultLockOptions`, no sharding;
//! - a shared lock on its own row of `mo_catalog.mo_tables` (`Compile.lockMetaTables` →
//!   `lockMoTable(..., LockMode_Shared)` in `pkg/sql/compile`), sharded by row: group = the
//!   account id, lock table id = `lockservice.ShardingByRow(row)` = Go's CRC-64/ECMA of the
//!   packed row key (`serial(account_id, db, table)` packed again as a string). The bind shows
//!   as `<account>-<crc>(2)` in the kernel's logs (2 is `mo_tables`' own id).
//!
//! Both binds must stay valid for DML on the table to proceed: a dead owner of either one stalls
//! it until the allocator invalidates the bind.

use serde::{Deserialize, Serialize};

/// One lock table as the allocator keys it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LockTableKey {
    pub group: u32,
    pub table: u64,
}

/// The lock table of a table's rows, from its `mo_tables.rel_id` (see [`crate::table_id`]).
pub fn row_lock_table(rel_id: u64) -> LockTableKey {
    LockTableKey {
        group: 0,
        table: rel_id,
    }
}

/// The lock table holding the table's own `mo_tables` row, which every DML statement locks in
/// shared mode. `account_id` is 0 for the `sys` account (users `root`, `dump`).
pub fn catalog_lock_table(account_id: u32, database: &str, table: &str) -> LockTableKey {
    // serial(account_id uint32, db varchar, table varchar) (`pkg/container/types/packer.go`).
    let mut serial = Vec::new();
    serial.push(UINT32_CODE);
    encode_uint(&mut serial, u64::from(account_id));
    encode_string(&mut serial, database.as_bytes());
    encode_string(&mut serial, table.as_bytes());
    // The lock row is the varchar key packed once more (`lockop.fetchVarlenaRows`).
    let mut row = Vec::new();
    encode_string(&mut row, &serial);
    LockTableKey {
        group: account_id,
        table: crc64_ecma(&row),
    }
}

const BYTES_CODE: u8 = 0x01;
const INT_ZERO_CODE: u8 = 0x14;
const UINT32_CODE: u8 = 0x3e;
const STRING_TYPE_CODE: u8 = 0x46;

/// `Packer.encodeUint`: 0x14 for zero, else 0x14 + n and the n significant big-endian bytes.
fn encode_uint(out: &mut Vec<u8>, v: u64) {
    if v == 0 {
        out.push(INT_ZERO_CODE);
        return;
    }
    let n = 8 - (v.leading_zeros() / 8) as usize;
    out.push(INT_ZERO_CODE + n as u8);
    out.extend_from_slice(&v.to_be_bytes()[8 - n..]);
}

/// `Packer.EncodeStringType`: 0x46 0x01, the bytes with each 0x00 followed by 0xFF, then 0x00.
fn encode_string(out: &mut Vec<u8>, b: &[u8]) {
    out.push(STRING_TYPE_CODE);
    out.push(BYTES_CODE);
    for &x in b {
        out.push(x);
        if x == 0 {
            out.push(0xFF);
        }
    }
    out.push(0x00);
}

/// Go's `crc64.Checksum(b, crc64.MakeTable(crc64.ECMA))` (also known as CRC-64/XZ).
fn crc64_ecma(b: &[u8]) -> u64 {
    const POLY: u64 = 0xC96C_5795_D787_0F42;
    let mut crc = !0u64;
    for &x in b {
        crc ^= u64::from(x);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc64_matches_the_standard_check_value() {
        // CRC-64/XZ check value of "123456789".
        assert_eq!(crc64_ecma(b"123456789"), 0x995D_C9BB_DF19_39FA);
    }

    #[test]
    fn the_catalog_lock_table_matches_one_seen_on_a_real_kernel() {
        // A v1.2.4 CN logged, for DML on exp.e2 by user dump (account 0): rows
        // "[46013e14460165787000ff4601653200ff00]", bind "0-14917160955167138648(2)-...".
        let mut row = Vec::new();
        let mut serial = vec![UINT32_CODE];
        encode_uint(&mut serial, 0);
        encode_string(&mut serial, b"exp");
        encode_string(&mut serial, b"e2");
        encode_string(&mut row, &serial);
        assert_eq!(
            row,
            [
                0x46, 0x01, 0x3e, 0x14, 0x46, 0x01, 0x65, 0x78, 0x70, 0x00, 0xff, 0x46, 0x01, 0x65,
                0x32, 0x00, 0xff, 0x00
            ]
        );
        assert_eq!(
            catalog_lock_table(0, "exp", "e2"),
            LockTableKey {
                group: 0,
                table: 14_917_160_955_167_138_648
            }
        );
    }

    #[test]
    fn accounts_pack_as_minimal_big_endian() {
        let mut v = Vec::new();
        encode_uint(&mut v, 5);
        encode_uint(&mut v, 0x0102);
        encode_uint(&mut v, u64::from(u32::MAX));
        assert_eq!(v, [0x15, 5, 0x16, 1, 2, 0x18, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(catalog_lock_table(7, "db", "t").group, 7);
        assert_ne!(
            catalog_lock_table(0, "db", "t"),
            catalog_lock_table(0, "db", "u")
        );
        assert_eq!(
            row_lock_table(272_685),
            LockTableKey {
                group: 0,
                table: 272_685
            }
        );
    }
}
