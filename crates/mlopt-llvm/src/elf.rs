//! A relocatable x86-64 ELF object holding read-only data under global hidden symbols: the model's
//! weights, written directly. Going through LLVM, hundreds of megabytes of weights were copied into a
//! constant, walked by the optimiser and copied again by the object writer (most of BERT-base's compile
//! time). Here the object is a list of pieces: its own headers and tables between the program's weight
//! buffers, which the archive writer copies straight into the library file.
//!
//! Layout: the ELF header, `.rodata` (each symbol's bytes at a 64-byte aligned offset), `.symtab`,
//! `.strtab`, `.shstrtab`, an empty `.note.GNU-stack` (the stack need not be executable), then the
//! section header table.

use std::sync::Arc;

const ALIGN: u64 = 64;

fn u16le(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn u32le(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn u64le(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// One section header's fields, in ELF64 order after the name offset.
struct Section {
    name: u32,
    kind: u32,
    flags: u64,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
    align: u64,
    entsize: u64,
}

/// A piece of an object: bytes of its own (headers, padding, tables) or a symbol's bytes, shared with the
/// program that holds them.
#[derive(Debug, Clone)]
enum Piece {
    Own(Vec<u8>),
    Shared(Arc<Vec<u8>>),
}

/// The data object as the pieces it is the concatenation of. A symbol's bytes are not copied into it:
/// written out, a transformer's hundreds of MB of weights go from the program's buffers to the file (a
/// contiguous copy cost a third of a large compile's memory, and fresh pages cost more than the bytes).
#[derive(Debug, Clone)]
pub struct DataObject {
    pieces: Vec<Piece>,
    symbols: Vec<String>,
}

impl DataObject {
    /// The object's bytes, in order.
    pub fn parts(&self) -> Vec<&[u8]> {
        self.pieces
            .iter()
            .map(|p| match p {
                Piece::Own(b) => b.as_slice(),
                Piece::Shared(b) => b.as_slice(),
            })
            .collect()
    }

    /// The global symbols it defines.
    pub fn symbols(&self) -> &[String] {
        &self.symbols
    }

    /// The whole object in one buffer (tests).
    pub fn to_vec(&self) -> Vec<u8> {
        self.parts().concat()
    }
}

/// Builds the object's own bytes, handing over shared ones in between.
#[derive(Default)]
struct Writer {
    pieces: Vec<Piece>,
    out: Vec<u8>,
    /// The bytes in `pieces`.
    before: u64,
}

impl Writer {
    fn len(&self) -> u64 {
        self.before + self.out.len() as u64
    }
    fn pad_to(&mut self, align: u64) {
        let n = self.len().next_multiple_of(align) - self.len();
        self.out.resize(self.out.len() + n as usize, 0);
    }
    fn share(&mut self, bytes: &Arc<Vec<u8>>) {
        let own = std::mem::take(&mut self.out);
        self.before += own.len() as u64 + bytes.len() as u64;
        self.pieces.push(Piece::Own(own));
        self.pieces.push(Piece::Shared(bytes.clone()));
    }
}

/// Bytes' length and first (up to 64) bytes: where equal bytes are looked for.
type Prefix<'a> = (usize, &'a [u8]);

/// The object: `symbols` (name, bytes) in `.rodata`, each 64-byte aligned, global and hidden. Symbols
/// whose bytes are equal share them (one copy, several names): the batch variants of a dynamic-batch
/// library pack most weights alike.
pub fn data_object(symbols: &[(String, Arc<Vec<u8>>)]) -> DataObject {
    let mut w = Writer::default();
    w.out.resize(64, 0u8);
    // .rodata
    w.pad_to(ALIGN);
    let rodata_at = w.len();
    let mut placed = Vec::with_capacity(symbols.len());
    // Bytes already placed (symbol index, offset), by length and first bytes.
    let mut seen: std::collections::HashMap<Prefix, Vec<(usize, u64)>> =
        std::collections::HashMap::new();
    for (i, (_, bytes)) in symbols.iter().enumerate() {
        let key = (bytes.len(), &bytes[..bytes.len().min(64)]);
        let same = seen.get(&key).and_then(|c| {
            c.iter()
                .find(|(j, _)| Arc::ptr_eq(&symbols[*j].1, bytes) || symbols[*j].1 == *bytes)
        });
        if let Some(&(_, at)) = same {
            placed.push(at);
            continue;
        }
        w.pad_to(ALIGN);
        let at = w.len() - rodata_at;
        placed.push(at);
        seen.entry(key).or_default().push((i, at));
        w.share(bytes);
    }
    let rodata_size = w.len() - rodata_at;
    // .strtab: "\0" then each name.
    let mut strtab = vec![0u8];
    let mut names = Vec::with_capacity(symbols.len());
    for (name, _) in symbols {
        names.push(strtab.len() as u32);
        strtab.extend_from_slice(name.as_bytes());
        strtab.push(0);
    }
    // .symtab: the null symbol, then one global hidden object per symbol in section 1 (.rodata).
    w.pad_to(8);
    let symtab_at = w.len();
    w.out.extend_from_slice(&[0u8; 24]);
    for (i, (_, bytes)) in symbols.iter().enumerate() {
        u32le(&mut w.out, names[i]);
        w.out.push(0x11); // STB_GLOBAL << 4 | STT_OBJECT
        w.out.push(2); // STV_HIDDEN
        u16le(&mut w.out, 1);
        u64le(&mut w.out, placed[i]);
        u64le(&mut w.out, bytes.len() as u64);
    }
    let symtab_size = w.len() - symtab_at;
    let strtab_at = w.len();
    w.out.extend_from_slice(&strtab);
    let shstrtab: &[u8] = b"\0.rodata\0.symtab\0.strtab\0.shstrtab\0.note.GNU-stack\0";
    let shstrtab_at = w.len();
    w.out.extend_from_slice(shstrtab);
    let note_at = w.len();
    let sections = [
        Section {
            name: 1,
            kind: 1,
            flags: 2,
            offset: rodata_at,
            size: rodata_size,
            link: 0,
            info: 0,
            align: ALIGN,
            entsize: 0,
        },
        Section {
            name: 9,
            kind: 2,
            flags: 0,
            offset: symtab_at,
            size: symtab_size,
            link: 3,
            info: 1,
            align: 8,
            entsize: 24,
        },
        Section {
            name: 17,
            kind: 3,
            flags: 0,
            offset: strtab_at,
            size: strtab.len() as u64,
            link: 0,
            info: 0,
            align: 1,
            entsize: 0,
        },
        Section {
            name: 25,
            kind: 3,
            flags: 0,
            offset: shstrtab_at,
            size: shstrtab.len() as u64,
            link: 0,
            info: 0,
            align: 1,
            entsize: 0,
        },
        Section {
            name: 35,
            kind: 1,
            flags: 0,
            offset: note_at,
            size: 0,
            link: 0,
            info: 0,
            align: 1,
            entsize: 0,
        },
    ];
    w.pad_to(8);
    let shoff = w.len();
    w.out.extend_from_slice(&[0u8; 64]); // the null section
    for s in &sections {
        u32le(&mut w.out, s.name);
        u32le(&mut w.out, s.kind);
        u64le(&mut w.out, s.flags);
        u64le(&mut w.out, 0); // address
        u64le(&mut w.out, s.offset);
        u64le(&mut w.out, s.size);
        u32le(&mut w.out, s.link);
        u32le(&mut w.out, s.info);
        u64le(&mut w.out, s.align);
        u64le(&mut w.out, s.entsize);
    }
    // The ELF header: 64-bit, little-endian, version 1, System V; relocatable, x86-64.
    let mut h = Vec::with_capacity(64);
    h.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    u16le(&mut h, 1); // ET_REL
    u16le(&mut h, 62); // EM_X86_64
    u32le(&mut h, 1);
    u64le(&mut h, 0); // entry
    u64le(&mut h, 0); // program headers: none
    u64le(&mut h, shoff);
    u32le(&mut h, 0); // flags
    u16le(&mut h, 64); // header size
    u16le(&mut h, 0);
    u16le(&mut h, 0);
    u16le(&mut h, 64); // section header size
    u16le(&mut h, sections.len() as u16 + 1);
    u16le(&mut h, 4); // .shstrtab's index
    let last = std::mem::take(&mut w.out);
    w.pieces.push(Piece::Own(last));
    // The header is the first 64 bytes of the first piece, which is always one of the object's own.
    if let Some(Piece::Own(first)) = w.pieces.first_mut() {
        first[..64].copy_from_slice(&h);
    }
    w.pieces
        .retain(|p| !matches!(p, Piece::Own(b) if b.is_empty()));
    DataObject {
        pieces: w.pieces,
        symbols: symbols.iter().map(|(n, _)| n.clone()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_land_aligned_with_their_bytes() {
        let a: Vec<u8> = (0..100).collect();
        let b = vec![7u8; 3];
        let o = data_object(&[
            ("w0".into(), Arc::new(a.clone())),
            ("w1".into(), Arc::new(b.clone())),
            ("empty".into(), Arc::new(vec![])),
        ]);
        assert_eq!(o.symbols(), ["w0", "w1", "empty"]);
        let o = o.to_vec();
        assert_eq!(&o[..4], b"\x7fELF");
        let shoff = u64::from_le_bytes(o[40..48].try_into().unwrap()) as usize;
        let section = |i: usize| &o[shoff + 64 * i..shoff + 64 * (i + 1)];
        let field =
            |s: &[u8], at: usize| u64::from_le_bytes(s[at..at + 8].try_into().unwrap()) as usize;
        let rodata = field(section(1), 24);
        assert_eq!(rodata % 64, 0);
        assert_eq!(&o[rodata..rodata + 100], a.as_slice());
        assert_eq!(&o[rodata + 128..rodata + 131], b.as_slice());
        // The second symbol's value is its aligned offset.
        let symtab = field(section(2), 24);
        let sym = &o[symtab + 48..symtab + 72];
        assert_eq!(u64::from_le_bytes(sym[8..16].try_into().unwrap()), 128);
        assert_eq!(sym[4], 0x11);
        assert_eq!(sym[5], 2);
    }

    #[test]
    fn equal_bytes_are_stored_once() {
        let a: Vec<u8> = (0..100).collect();
        let o = data_object(&[
            ("w0".into(), Arc::new(a.clone())),
            ("w1".into(), Arc::new(vec![7u8; 3])),
            ("w0_again".into(), Arc::new(a.clone())),
        ]);
        let o = o.to_vec();
        let shoff = u64::from_le_bytes(o[40..48].try_into().unwrap()) as usize;
        let field = |i: usize, at: usize| {
            u64::from_le_bytes(
                o[shoff + 64 * i + at..shoff + 64 * i + at + 8]
                    .try_into()
                    .unwrap(),
            )
        };
        // .rodata holds a once (64-aligned, then the 3 bytes at 128).
        assert_eq!(field(1, 32), 131);
        let symtab = field(2, 24) as usize;
        let value = |k: usize| {
            let sym = &o[symtab + 24 * k..symtab + 24 * (k + 1)];
            u64::from_le_bytes(sym[8..16].try_into().unwrap())
        };
        assert_eq!((value(1), value(2), value(3)), (0, 128, 0));
    }
}
