//! A relocatable x86-64 ELF object holding read-only data under global hidden symbols: the model's
//! weights, written directly. Going through LLVM, hundreds of megabytes of weights were copied into a
//! constant, walked by the optimiser and copied again by the object writer (most of BERT-base's compile
//! time); here each byte is copied once.
//!
//! Layout: the ELF header, `.rodata` (each symbol's bytes at a 64-byte aligned offset), `.symtab`,
//! `.strtab`, `.shstrtab`, an empty `.note.GNU-stack` (the stack need not be executable), then the
//! section header table.

const ALIGN: u64 = 64;

fn pad_to(out: &mut Vec<u8>, align: u64) {
    while !(out.len() as u64).is_multiple_of(align) {
        out.push(0);
    }
}

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

/// The object: `symbols` (name, bytes) in `.rodata`, each 64-byte aligned, global and hidden.
pub fn data_object(symbols: &[(String, &[u8])]) -> Vec<u8> {
    // Sized once (data, alignment, symbols and names), so hundreds of MB of weights are not regrown.
    let data: usize = symbols.iter().map(|(n, b)| b.len() + ALIGN as usize + 24 + n.len() + 1).sum();
    let mut out = Vec::with_capacity(data + 1024);
    out.resize(64, 0u8);
    // .rodata
    pad_to(&mut out, ALIGN);
    let rodata_at = out.len() as u64;
    let mut placed = Vec::with_capacity(symbols.len());
    for (_, bytes) in symbols {
        pad_to(&mut out, ALIGN);
        placed.push(out.len() as u64 - rodata_at);
        out.extend_from_slice(bytes);
    }
    let rodata_size = out.len() as u64 - rodata_at;
    // .strtab: "\0" then each name.
    let mut strtab = vec![0u8];
    let mut names = Vec::with_capacity(symbols.len());
    for (name, _) in symbols {
        names.push(strtab.len() as u32);
        strtab.extend_from_slice(name.as_bytes());
        strtab.push(0);
    }
    // .symtab: the null symbol, then one global hidden object per symbol in section 1 (.rodata).
    pad_to(&mut out, 8);
    let symtab_at = out.len() as u64;
    out.extend_from_slice(&[0u8; 24]);
    for (i, (_, bytes)) in symbols.iter().enumerate() {
        u32le(&mut out, names[i]);
        out.push(0x11); // STB_GLOBAL << 4 | STT_OBJECT
        out.push(2); // STV_HIDDEN
        u16le(&mut out, 1);
        u64le(&mut out, placed[i]);
        u64le(&mut out, bytes.len() as u64);
    }
    let symtab_size = out.len() as u64 - symtab_at;
    let strtab_at = out.len() as u64;
    out.extend_from_slice(&strtab);
    let shstrtab: &[u8] = b"\0.rodata\0.symtab\0.strtab\0.shstrtab\0.note.GNU-stack\0";
    let shstrtab_at = out.len() as u64;
    out.extend_from_slice(shstrtab);
    let note_at = out.len() as u64;
    let sections = [
        Section { name: 1, kind: 1, flags: 2, offset: rodata_at, size: rodata_size, link: 0, info: 0, align: ALIGN, entsize: 0 },
        Section { name: 9, kind: 2, flags: 0, offset: symtab_at, size: symtab_size, link: 3, info: 1, align: 8, entsize: 24 },
        Section { name: 17, kind: 3, flags: 0, offset: strtab_at, size: strtab.len() as u64, link: 0, info: 0, align: 1, entsize: 0 },
        Section { name: 25, kind: 3, flags: 0, offset: shstrtab_at, size: shstrtab.len() as u64, link: 0, info: 0, align: 1, entsize: 0 },
        Section { name: 35, kind: 1, flags: 0, offset: note_at, size: 0, link: 0, info: 0, align: 1, entsize: 0 },
    ];
    pad_to(&mut out, 8);
    let shoff = out.len() as u64;
    out.extend_from_slice(&[0u8; 64]); // the null section
    for s in &sections {
        u32le(&mut out, s.name);
        u32le(&mut out, s.kind);
        u64le(&mut out, s.flags);
        u64le(&mut out, 0); // address
        u64le(&mut out, s.offset);
        u64le(&mut out, s.size);
        u32le(&mut out, s.link);
        u32le(&mut out, s.info);
        u64le(&mut out, s.align);
        u64le(&mut out, s.entsize);
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
    out[..64].copy_from_slice(&h);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_land_aligned_with_their_bytes() {
        let a: Vec<u8> = (0..100).collect();
        let b = vec![7u8; 3];
        let o = data_object(&[("w0".into(), &a), ("w1".into(), &b), ("empty".into(), &[])]);
        assert_eq!(&o[..4], b"\x7fELF");
        let shoff = u64::from_le_bytes(o[40..48].try_into().unwrap()) as usize;
        let section = |i: usize| &o[shoff + 64 * i..shoff + 64 * (i + 1)];
        let field = |s: &[u8], at: usize| u64::from_le_bytes(s[at..at + 8].try_into().unwrap()) as usize;
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
}
