//! What each baseline assumes of the fabric it is deployed on, and the
//! notes a report prints when a scenario breaks those assumptions (the
//! row is still simulated, but it no longer shows the baseline as its
//! operators run it).

use crate::scenario::Scenario;

/// Notes on how `scn` departs from what its transport assumes, one line
/// each (empty when it departs from nothing). The link layer a baseline
/// brings with it (IRN without PFC; InfiniBand's credits and adaptive
/// routing, see docs/baselines.md) is its deployment, not a departure.
/// MetaRoCE assumes nothing of the fabric, so it never gets a note.
pub fn baseline_notes(scn: &Scenario) -> Vec<String> {
    let sw = &scn.switch;
    let mut notes = Vec::new();
    match scn.transport.kind.as_str() {
        "rocev2" => {
            // Go-back-N resends everything after a loss: RoCEv2 is deployed
            // on a lossless (PFC) fabric so that losses are rare.
            if !sw.pfc {
                notes.push(
                    "rocev2 is deployed over PFC (lossless); switch.pfc is off here, so every buffer overflow is a go-back-N rewind"
                        .to_string(),
                );
            }
            if sw.loss > 0.0 {
                notes.push(format!(
                    "rocev2 assumes a lossless fabric; switch.loss = {} drops packets at random, each one a go-back-N rewind",
                    sw.loss
                ));
            }
        }
        // InfiniBand's credit link layer never drops for lack of buffer;
        // its RC transport repairs a loss only by timeout.
        "ib" if sw.loss > 0.0 => {
            notes.push(format!(
                "ib models a lossless credit link layer; switch.loss = {} drops packets anyway, and only the RTO (1.048 ms) repairs them",
                sw.loss
            ));
        }
        _ => {}
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(transport: &str, switch: &str) -> Scenario {
        let text = format!(
            "name = \"x\"\n[topology]\nkind = \"star\"\nhosts = 4\nlink_gbps = 100\n[switch]\n{switch}\n[transport]\nkind = \"{transport}\"\n"
        );
        Scenario::parse(&text, "x.toml").unwrap()
    }

    #[test]
    fn random_loss_under_ib_gets_a_note() {
        let n = baseline_notes(&scenario("ib", "loss = 0.01"));
        assert_eq!(n.len(), 1, "{n:?}");
        assert!(n[0].contains("switch.loss = 0.01"), "{n:?}");
    }

    #[test]
    fn rocev2_without_pfc_gets_a_note_and_metaroce_never() {
        assert_eq!(baseline_notes(&scenario("rocev2", "pfc = false")).len(), 1);
        assert!(baseline_notes(&scenario("rocev2", "pfc = true")).is_empty());
        assert!(baseline_notes(&scenario("metaroce", "loss = 0.1")).is_empty());
    }
}
