//! A MessagePack reader over a byte slice: one value head at a time, strings and binaries borrowed,
//! nothing allocated. The event decoder builds its typed output straight from the heads, so memory
//! is the output's size (at most a few times the payload), never a generic value tree (about 40
//! bytes per 1-byte element). Values the decoder does not want are skipped iteratively: no
//! recursion, so no nesting depth can overflow the stack.

use std::fmt;

/// A truncated or invalid MessagePack encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    /// The payload ends inside a value.
    Truncated { at: usize },
    /// 0xc1, the one byte MessagePack never uses.
    ReservedByte { at: usize },
}

/// The head of one value: scalars whole, strings and binaries as borrowed bytes, arrays and maps
/// as their element count (the elements follow).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Head<'a> {
    Nil,
    Bool(bool),
    Uint(u64),
    Int(i64),
    Float(f64),
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(usize),
    Map(usize),
    Ext(i8, &'a [u8]),
}

impl fmt::Display for Head<'_> {
    /// What the value is, for error messages: its kind and a bounded preview.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Head::Nil => f.write_str("nil"),
            Head::Bool(b) => write!(f, "bool {b}"),
            Head::Uint(u) => write!(f, "integer {u}"),
            Head::Int(i) => write!(f, "integer {i}"),
            Head::Float(x) => write!(f, "float {x}"),
            Head::Str(s) => {
                let text = String::from_utf8_lossy(&s[..s.len().min(40)]);
                let more = if s.len() > 40 { "..." } else { "" };
                write!(f, "string {text:?}{more}")
            }
            Head::Bin(b) => write!(f, "{} bytes of binary", b.len()),
            Head::Array(n) => write!(f, "array of {n}"),
            Head::Map(n) => write!(f, "map of {n}"),
            Head::Ext(t, b) => write!(f, "extension type {t} ({} bytes)", b.len()),
        }
    }
}

/// A cursor over one payload.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The current offset (to come back to with [`Reader::seek`]).
    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn seek(&mut self, pos: usize) {
        debug_assert!(pos <= self.buf.len());
        self.pos = pos;
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.remaining() < n {
            return Err(Malformed::Truncated { at: self.pos });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn be(&mut self, n: usize) -> Result<u64, Malformed> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn sized(&mut self, len_bytes: usize) -> Result<&'a [u8], Malformed> {
        let n = self.be(len_bytes)?;
        // A length beyond the payload is truncation, whatever usize can hold.
        let n = usize::try_from(n).map_err(|_| Malformed::Truncated { at: self.pos })?;
        self.take(n)
    }

    /// Reads the next value as a `u32` when it is an unsigned integer encoded in at most four
    /// bytes (how every token id is written); anything else is read as [`Reader::head`] reads
    /// it and returned as `Err(head)`. A token list's loop: one branch per id instead of the
    /// head's 256-way match and byte fold.
    #[inline]
    pub fn small_uint(&mut self) -> Result<Result<u32, Head<'a>>, Malformed> {
        let rest = &self.buf[self.pos..];
        let (value, len) = match *rest {
            [b @ 0x00..=0x7f, ..] => (u32::from(b), 1),
            [0xcc, b, ..] => (u32::from(b), 2),
            [0xcd, b0, b1, ..] => (u32::from(u16::from_be_bytes([b0, b1])), 3),
            [0xce, b0, b1, b2, b3, ..] => (u32::from_be_bytes([b0, b1, b2, b3]), 5),
            _ => return self.head().map(Err),
        };
        self.pos += len;
        Ok(Ok(value))
    }

    /// Reads the next value's head.
    pub fn head(&mut self) -> Result<Head<'a>, Malformed> {
        let at = self.pos;
        let b = self.take(1)?[0];
        Ok(match b {
            0x00..=0x7f => Head::Uint(u64::from(b)),
            0x80..=0x8f => Head::Map(usize::from(b & 0x0f)),
            0x90..=0x9f => Head::Array(usize::from(b & 0x0f)),
            0xa0..=0xbf => Head::Str(self.take(usize::from(b & 0x1f))?),
            0xc0 => Head::Nil,
            0xc1 => return Err(Malformed::ReservedByte { at }),
            0xc2 => Head::Bool(false),
            0xc3 => Head::Bool(true),
            0xc4 => Head::Bin(self.sized(1)?),
            0xc5 => Head::Bin(self.sized(2)?),
            0xc6 => Head::Bin(self.sized(4)?),
            0xc7..=0xc9 => {
                let len_bytes = 1 << (b - 0xc7);
                let n = self.be(len_bytes)? as usize;
                let t = self.take(1)?[0] as i8;
                Head::Ext(t, self.take(n)?)
            }
            0xca => Head::Float(f64::from(f32::from_bits(self.be(4)? as u32))),
            0xcb => Head::Float(f64::from_bits(self.be(8)?)),
            0xcc => Head::Uint(self.be(1)?),
            0xcd => Head::Uint(self.be(2)?),
            0xce => Head::Uint(self.be(4)?),
            0xcf => Head::Uint(self.be(8)?),
            0xd0 => Head::Int(i64::from(self.be(1)? as u8 as i8)),
            0xd1 => Head::Int(i64::from(self.be(2)? as u16 as i16)),
            0xd2 => Head::Int(i64::from(self.be(4)? as u32 as i32)),
            0xd3 => Head::Int(self.be(8)? as i64),
            0xd4..=0xd8 => {
                let n = 1 << (b - 0xd4);
                let t = self.take(1)?[0] as i8;
                Head::Ext(t, self.take(n)?)
            }
            0xd9 => Head::Str(self.sized(1)?),
            0xda => Head::Str(self.sized(2)?),
            0xdb => Head::Str(self.sized(4)?),
            0xdc => Head::Array(self.be(2)? as usize),
            0xdd => Head::Array(self.be(4)? as usize),
            0xde => Head::Map(self.be(2)? as usize),
            0xdf => Head::Map(self.be(4)? as usize),
            0xe0..=0xff => Head::Int(i64::from(b as i8)),
        })
    }

    /// Skips one whole value (an array or a map with everything in it), iteratively.
    pub fn skip(&mut self) -> Result<(), Malformed> {
        let mut pending: u64 = 1;
        while pending > 0 {
            pending -= 1;
            match self.head()? {
                Head::Array(n) => pending += n as u64,
                Head::Map(n) => pending += 2 * n as u64,
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_width() {
        let bytes = [
            0x05, 0xe0, 0xcc, 0xff, 0xcd, 0x01, 0x00, 0xd0, 0x80, 0xd3, 0xff, 0xff, 0xff, 0xff,
            0xff, 0xff, 0xff, 0xfe, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xc0,
            0xc3, 0xa2, b'h', b'i', 0xc4, 0x01, 0x09, 0xdc, 0x00, 0x02,
        ];
        let mut r = Reader::new(&bytes);
        let heads: Vec<Head> =
            std::iter::from_fn(|| (r.remaining() > 0).then(|| r.head().unwrap())).collect();
        assert_eq!(
            heads,
            vec![
                Head::Uint(5),
                Head::Int(-32),
                Head::Uint(255),
                Head::Uint(256),
                Head::Int(-128),
                Head::Int(-2),
                Head::Uint(u64::MAX),
                Head::Nil,
                Head::Bool(true),
                Head::Str(b"hi"),
                Head::Bin(&[9]),
                Head::Array(2),
            ]
        );
    }

    #[test]
    fn skips_nested_values_and_reports_truncation() {
        // [[1, {"a": [2]}], 3] then 4
        let bytes = [0x92, 0x92, 0x01, 0x81, 0xa1, b'a', 0x91, 0x02, 0x03, 0x04];
        let mut r = Reader::new(&bytes);
        r.skip().unwrap();
        assert_eq!(r.head().unwrap(), Head::Uint(4));
        // An array claiming 2^32-1 elements in 5 bytes: truncated, nothing allocated.
        let mut r = Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(r.skip(), Err(Malformed::Truncated { at: 5 }));
        assert_eq!(
            Reader::new(&[0xc1]).head(),
            Err(Malformed::ReservedByte { at: 0 })
        );
    }
}
