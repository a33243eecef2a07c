//! The dump reader over hostile files: raw bytes, and (structure-aware) a valid dump built from
//! the input then corrupted at input-chosen offsets. It must never panic, and in the second
//! mode every block the corruption did not touch must come back.
#![no_main]
use libfuzzer_sys::fuzz_target;
use retry_agent::{
    capture::Event,
    pipeline::Record,
    recorder::{DumpHeader, DumpReader, DumpReason, DumpWriter, RecorderConfig},
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode & 1 == 0 {
        let _ = DumpReader::read(rest);
        return;
    }
    // First half: how many records; second half: (offset, xor) corruption pairs.
    let (shape, damage) = rest.split_at(rest.len() / 2);
    let n = shape.iter().map(|&b| u64::from(b)).sum::<u64>() * 8 + 1;
    let header = DumpHeader::new(DumpReason::Other("fuzz".into()), RecorderConfig::default(), 0, n);
    let Ok(mut w) = DumpWriter::new(Vec::new(), &header) else { return };
    for i in 0..n {
        let _ = w.push(&Record::Event(Event::ProcessExit { pid: i as u32, ts_ns: i }));
    }
    let Ok((orig, spans)) = w.finish_with_spans() else { return };
    let mut file = orig.clone();
    for pair in damage.chunks_exact(3) {
        let off = (usize::from(pair[0]) << 8 | usize::from(pair[1])) % file.len().max(1);
        file[off] ^= pair[2];
    }
    if mode & 2 != 0 {
        let cut = file.len() - (usize::from(mode >> 2) % file.len().max(1));
        file.truncate(cut);
    }
    let Ok(out) = DumpReader::read(&file) else { return };
    let got: std::collections::BTreeSet<u64> = out
        .records
        .iter()
        .filter_map(|r| if let Record::Event(Event::ProcessExit { ts_ns, .. }) = r { Some(*ts_ns) } else { None })
        .collect();
    let mut first = 0u64;
    for s in &spans {
        let range = s.start as usize..s.end as usize;
        if file.get(range.clone()) == orig.get(range) {
            for id in first..first + u64::from(s.records) {
                assert!(got.contains(&id), "intact block lost record {id}");
            }
        }
        first += u64::from(s.records);
    }
    assert!(got.iter().all(|&id| id < n), "invented records");
    if file != orig {
        assert!(!out.loss.is_clean(), "damage unreported");
    }
});
