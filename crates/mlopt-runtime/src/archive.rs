//! Static libraries: a GNU `ar` archive of ELF objects with the symbol index linkers read.
//!
//! A member is given as the byte slices it is the concatenation of, so a weights object goes from the
//! program's buffers to the file without being copied into one buffer first (for a transformer that copy
//! was a third of the compile's memory).
//!
//! Layout: `!<arch>\n`; the index member `/` (big-endian: the count, each symbol's member offset, then
//! the names, NUL-terminated), or `/SYM64/` with 8-byte fields when an offset does not fit 32 bits; the
//! long-name member `//` when a name is over 15 bytes; then each member: a 60-byte header (name, mtime,
//! uid, gid, mode, size, "`\n", all ASCII, zero times and ids so builds are reproducible) and its bytes,
//! padded to an even size with `\n`.

use std::io::{self, Write};

/// One object of a library.
#[derive(Debug, Clone)]
pub struct Member<'a> {
    /// The file name inside the archive.
    pub name: String,
    /// The object's bytes, in order.
    pub parts: Vec<&'a [u8]>,
    /// The global symbols it defines, for the index.
    pub symbols: Vec<String>,
}

impl<'a> Member<'a> {
    /// An ELF object in one buffer; its symbols are read from its symbol table.
    pub fn object(name: impl Into<String>, bytes: &'a [u8]) -> io::Result<Member<'a>> {
        Ok(Member {
            name: name.into(),
            parts: vec![bytes],
            symbols: defined_symbols(bytes)?,
        })
    }

    fn size(&self) -> u64 {
        self.parts.iter().map(|p| p.len() as u64).sum()
    }
}

/// The global symbols an ELF object defines.
pub fn defined_symbols(bytes: &[u8]) -> io::Result<Vec<String>> {
    use object::{Object, ObjectSymbol};
    let file = object::File::parse(bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not an object file: {e}"),
        )
    })?;
    Ok(file
        .symbols()
        .filter(|s| s.is_global() && s.is_definition())
        .filter_map(|s| s.name().ok().map(str::to_string))
        .filter(|n| !n.is_empty())
        .collect())
}

const HEADER: u64 = 60;

/// A member's header; `mode` 0 for the index, as GNU ar writes it.
fn header(w: &mut impl Write, name: &str, size: u64, mode: u32) -> io::Result<()> {
    writeln!(w, "{name:<16}{:<12}{:<6}{:<6}{mode:<8}{size:<10}`", 0, 0, 0)
}

/// The largest member an archive header can state: ten decimal digits.
const MAX_MEMBER: u64 = 9_999_999_999;

/// Writes the archive of `members` to `w`; a member over `MAX_MEMBER` bytes is an error, not a
/// header whose size field overflows into the next.
pub fn write(w: &mut impl Write, members: &[Member]) -> io::Result<()> {
    if let Some(m) = members.iter().find(|m| m.size() > MAX_MEMBER) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is {} bytes, more than an ar archive member can hold",
                m.name,
                m.size()
            ),
        ));
    }
    // Long names: "name/\n" each, referred to by offset as "/N".
    let mut long = Vec::new();
    let names: Vec<String> = members
        .iter()
        .map(|m| {
            if m.name.len() <= 15 {
                format!("{}/", m.name)
            } else {
                let at = long.len();
                long.extend_from_slice(m.name.as_bytes());
                long.extend_from_slice(b"/\n");
                format!("/{at}")
            }
        })
        .collect();
    let padded = |n: u64| n + n % 2;
    let symbols: u64 = members.iter().map(|m| m.symbols.len() as u64).sum();
    let strings: u64 = members
        .iter()
        .flat_map(|m| &m.symbols)
        .map(|s| s.len() as u64 + 1)
        .sum();
    // The members' offsets depend on the index's size, which depends on its field width.
    let layout = |width: u64| {
        let index = padded(width * (1 + symbols) + strings);
        let mut at = 8
            + HEADER
            + index
            + if long.is_empty() {
                0
            } else {
                HEADER + padded(long.len() as u64)
            };
        let offsets: Vec<u64> = members
            .iter()
            .map(|m| {
                let here = at;
                at += HEADER + padded(m.size());
                here
            })
            .collect();
        (index, offsets)
    };
    let (mut width, (mut index, mut offsets)) = (4, layout(4));
    if offsets.iter().any(|o| *o > u64::from(u32::MAX)) {
        width = 8;
        (index, offsets) = layout(8);
    }
    w.write_all(b"!<arch>\n")?;
    header(w, if width == 4 { "/" } else { "/SYM64/" }, index, 0)?;
    let field = |w: &mut dyn Write, v: u64| {
        if width == 4 {
            w.write_all(&(v as u32).to_be_bytes())
        } else {
            w.write_all(&v.to_be_bytes())
        }
    };
    field(w, symbols)?;
    for (m, at) in members.iter().zip(&offsets) {
        for _ in &m.symbols {
            field(w, *at)?;
        }
    }
    for s in members.iter().flat_map(|m| &m.symbols) {
        w.write_all(s.as_bytes())?;
        w.write_all(&[0])?;
    }
    if (width * (1 + symbols) + strings) % 2 == 1 {
        w.write_all(&[0])?;
    }
    if !long.is_empty() {
        header(w, "//", long.len() as u64, 0)?;
        w.write_all(&long)?;
        if long.len() % 2 == 1 {
            w.write_all(b"\n")?;
        }
    }
    for (m, name) in members.iter().zip(&names) {
        header(w, name, m.size(), 644)?;
        for p in &m.parts {
            w.write_all(p)?;
        }
        if m.size() % 2 == 1 {
            w.write_all(b"\n")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The archive reads back with `object`'s archive reader: every member whole, every symbol indexed
    /// at its member.
    #[test]
    fn members_and_index_read_back() {
        let runtime = Member::object("mlopt_runtime.o", crate::RUNTIME_OBJECT).unwrap();
        assert!(
            runtime.symbols.iter().any(|s| s.starts_with("mlopt_")),
            "{:?}",
            runtime.symbols
        );
        let data = [b"abc".as_slice(), b"de".as_slice()];
        let split = Member {
            name: "a_member_with_a_long_name.o".into(),
            parts: data.to_vec(),
            symbols: vec!["w0".into(), "w1".into()],
        };
        let odd = Member {
            name: "odd.o".into(),
            parts: vec![b"x"],
            symbols: vec![],
        };
        let mut out = Vec::new();
        write(&mut out, &[split, odd, runtime.clone()]).unwrap();
        let a = object::read::archive::ArchiveFile::parse(out.as_slice()).unwrap();
        let members: Vec<_> = a.members().map(|m| m.unwrap()).collect();
        let names: Vec<_> = members
            .iter()
            .map(|m| String::from_utf8_lossy(m.name()).into_owned())
            .collect();
        assert_eq!(
            names,
            ["a_member_with_a_long_name.o", "odd.o", "mlopt_runtime.o"]
        );
        assert_eq!(members[0].data(out.as_slice()).unwrap(), b"abcde");
        assert_eq!(members[1].data(out.as_slice()).unwrap(), b"x");
        assert_eq!(
            members[2].data(out.as_slice()).unwrap(),
            crate::RUNTIME_OBJECT
        );
        let index: Vec<_> = a.symbols().unwrap().unwrap().map(|s| s.unwrap()).collect();
        assert_eq!(index.len(), 2 + runtime.symbols.len());
        for s in index {
            let at = a.member(s.offset()).unwrap();
            let name = String::from_utf8_lossy(s.name()).into_owned();
            let expect = if name.starts_with('w') {
                "a_member_with_a_long_name.o"
            } else {
                "mlopt_runtime.o"
            };
            assert_eq!(at.name(), expect.as_bytes(), "{name}");
        }
        // A member whose size does not fit the header's ten digits is refused.
        let chunk = vec![0u8; 1 << 20];
        let huge = Member {
            name: "w.o".into(),
            parts: vec![chunk.as_slice(); 9537],
            symbols: vec![],
        };
        let e = write(&mut Vec::new(), &[huge]).unwrap_err();
        assert!(
            e.to_string()
                .contains("more than an ar archive member can hold"),
            "{e}"
        );
    }
}
