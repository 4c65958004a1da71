//! Fuzzes the text IR parser: any text parses to a verified graph or an error, never a panic, and a graph
//! that parses prints back to text that parses to the same print.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(g) = mlopt_ir::parse::parse(text, &|_| None) {
        let printed = mlopt_ir::print::print(&g);
        let again = mlopt_ir::parse::parse(&printed, &|n| g.const_by_name(n))
            .expect("printed IR must parse");
        assert_eq!(mlopt_ir::print::print(&again), printed);
    }
});
