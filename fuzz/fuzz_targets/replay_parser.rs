//! The RMM CSV event-log parser on arbitrary bytes: never a panic; the streaming reader and
//! `parse_log` agree; every event it accepts reads back the same from a canonical log.
#![no_main]

use libfuzzer_sys::fuzz_target;
use streamalloc::replay::{parse_log, parse_log_str, Action, EventReader};

fuzz_target!(|data: &[u8]| {
    let lines = data.split(|&b| b == b'\n').count();
    let mut events = Vec::new();
    let mut first_error = None;
    match EventReader::new(data) {
        Ok(reader) => {
            let mut last_line = 1;
            for item in reader {
                match item {
                    Ok(event) => {
                        assert!(event.line > last_line && event.line <= lines, "{event:?}");
                        last_line = event.line;
                        assert_eq!(event.action.as_str().parse::<Action>(), Ok(event.action));
                        events.push(event);
                    }
                    Err(e) => {
                        // Errors print (no panic in Display) and name a line of the input.
                        let _ = e.to_string();
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        Err(e) => {
            let _ = e.to_string();
            first_error = Some(e);
        }
    }
    // `parse_log` is the reader collected: the first error, else every event.
    match parse_log(data) {
        Ok(all) => {
            assert!(
                first_error.is_none(),
                "{first_error:?} but parse_log succeeded"
            );
            assert_eq!(all, events);
        }
        Err(e) => assert_eq!(Some(e), first_error),
    }
    // A canonical log of the accepted events (no Time column) reads back the same.
    if first_error.is_none() {
        let mut text = String::from("Thread,Action,Pointer,Size,Stream\n");
        for e in &events {
            let ptr = if e.ptr.is_null() {
                "(nil)".to_owned()
            } else {
                format!("{:#x}", e.ptr.addr())
            };
            text += &format!(
                "{},{},{ptr},{},{:#x}\n",
                e.thread, e.action, e.bytes, e.stream
            );
        }
        let again = parse_log_str(&text).expect("a canonical log parses");
        assert_eq!(again.len(), events.len());
        for (i, (a, e)) in again.iter().zip(&events).enumerate() {
            assert_eq!(a.line, i + 2);
            assert_eq!(
                (a.thread, a.action, a.ptr, a.bytes, a.stream, a.time),
                (e.thread, e.action, e.ptr, e.bytes, e.stream, None)
            );
        }
    }
});
