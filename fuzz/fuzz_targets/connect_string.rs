//! Any string given as a connect string parses or is refused with an
//! error; what parses prints back to a string that parses the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zkgate::zk::ConnectString;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(parsed) = text.parse::<ConnectString>() {
        let printed = parsed.to_string();
        let again: ConnectString = printed.parse().expect("a printed connect string parses");
        assert_eq!(again, parsed);
    }
});
