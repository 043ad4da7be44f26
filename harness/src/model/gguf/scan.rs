//! A pre-read of an untrusted GGUF header before candle's `Content::read`: the problems candle
//! would panic on or report badly (an alignment of 0, a tensor type llama.cpp knows and candle
//! does not).
use std::io::{Read, Seek, SeekFrom};

/// llama.cpp's name of a GGML type id candle does not read.
pub(super) fn llama_cpp_type(t: u32) -> Option<&'static str> {
    const NAMES: [&str; 24] = [
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4",
        "Q4_0_4_8",
        "Q4_0_8_8",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4",
        "IQ4_NL_4_8",
        "IQ4_NL_8_8",
        "MXFP4",
    ];
    t.checked_sub(16)
        .and_then(|i| NAMES.get(i as usize))
        .copied()
}

/// What [`scan`] finds in a GGUF header.
#[derive(Debug, Default)]
pub(super) struct Scan {
    /// An integer `general.alignment`.
    pub(super) alignment: Option<i64>,
    /// The first tensor whose GGML type candle cannot read, and that type's id.
    pub(super) unsupported: Option<(String, u32)>,
}

/// Walks the GGUF metadata (without keeping it) to find an integer `general.alignment`, then
/// the tensor table to find a tensor type candle cannot read. Errors mean "malformed";
/// `Content::read` then reports the problem in its own words.
pub(super) fn scan<R: Read + Seek>(r: &mut R) -> std::io::Result<Scan> {
    use std::io::{Error, ErrorKind};
    fn u32_of<R: Read>(r: &mut R) -> std::io::Result<u32> {
        let mut b = [0u8; 4];
        r.read_exact(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }
    fn u64_of<R: Read>(r: &mut R) -> std::io::Result<u64> {
        let mut b = [0u8; 8];
        r.read_exact(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    let bad = || Error::new(ErrorKind::InvalidData, "malformed");
    let magic = u32_of(r)?;
    if magic != 0x4655_4747 {
        return Err(bad());
    }
    let v1 = u32_of(r)? == 1;
    let len = |r: &mut R| {
        if v1 {
            u32_of(r).map(u64::from)
        } else {
            u64_of(r)
        }
    };
    let tensors = len(r)?;
    let kvs = len(r)?;
    let file_len = {
        let here = r.stream_position()?;
        let end = r.seek(SeekFrom::End(0))?;
        r.seek(SeekFrom::Start(here))?;
        end
    };
    // Skips one value of type `t`; returns an integer value when it is one.
    fn skip<R: Read + Seek>(
        r: &mut R,
        t: u32,
        depth: u32,
        len: &dyn Fn(&mut R) -> std::io::Result<u64>,
        file_len: u64,
    ) -> std::io::Result<Option<i64>> {
        let bad = || Error::new(ErrorKind::InvalidData, "malformed");
        let mut int = |n: usize, signed: bool| -> std::io::Result<Option<i64>> {
            let mut b = [0u8; 8];
            r.read_exact(&mut b[..n])?;
            let u = u64::from_le_bytes(b);
            let v = if signed && n < 8 && (u >> (8 * n - 1)) & 1 == 1 {
                (u | (!0u64 << (8 * n))) as i64
            } else {
                u as i64
            };
            Ok(Some(v))
        };
        match t {
            0 => int(1, false),
            1 => int(1, true),
            2 => int(2, false),
            3 => int(2, true),
            4 => int(4, false),
            5 => int(4, true),
            10 => int(8, false),
            11 => int(8, true),
            6 | 7 | 12 => {
                let n = match t {
                    7 => 1,
                    12 => 8,
                    _ => 4,
                };
                if r.seek(SeekFrom::Current(n))? > file_len {
                    return Err(bad());
                }
                Ok(None)
            }
            8 => {
                let n = len(r)?;
                let here = r.stream_position()?;
                if n > file_len.saturating_sub(here) {
                    return Err(bad());
                }
                r.seek(SeekFrom::Current(n as i64)).map(|_| None)
            }
            9 => {
                if depth > 2 {
                    return Err(bad());
                }
                let et = u32_of(r)?;
                let n = len(r)?;
                if n > file_len {
                    return Err(bad());
                }
                for _ in 0..n {
                    skip(r, et, depth + 1, len, file_len)?;
                }
                Ok(None)
            }
            _ => Err(bad()),
        }
    }
    if kvs > file_len || tensors > file_len {
        return Err(bad());
    }
    let mut out = Scan::default();
    let name = |r: &mut R| -> std::io::Result<Vec<u8>> {
        let n = len(r)?;
        if n > 4096 {
            return Err(bad());
        }
        let mut key = vec![0u8; n as usize];
        r.read_exact(&mut key)?;
        Ok(key)
    };
    for _ in 0..kvs {
        let key = name(r)?;
        let t = u32_of(r)?;
        let v = skip(r, t, 0, &len, file_len)?;
        if key == b"general.alignment" {
            out.alignment = v;
        }
    }
    for _ in 0..tensors {
        let key = name(r)?;
        let dims = u32_of(r)?;
        if dims > 8 {
            return Err(bad());
        }
        for _ in 0..dims {
            len(r)?;
        }
        let t = u32_of(r)?;
        u64_of(r)?;
        // The type ids candle 0.11.1's `GgmlDType::from_u32` accepts.
        if !matches!(t, 0..=3 | 6..=15 | 30) {
            out.unsupported = Some((String::from_utf8_lossy(&key).into_owned(), t));
            break;
        }
    }
    Ok(out)
}
