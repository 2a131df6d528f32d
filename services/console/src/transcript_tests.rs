use super::*;

const ANTHROPIC: &str = r#"{"type":"start","driver":"anthropic","model":"claude-x"}
{"type":"message","turn":0,"message":{"role":"user","content":"fix <b>it</b>"}}
{"type":"message","turn":1,"message":{"role":"assistant","content":[{"type":"text","text":"looking"},{"type":"tool_use","id":"t1","name":"bash","input":{"command":"ls"}}]}}
{"type":"usage","turn":1,"input_tokens":5}
{"type":"message","turn":1,"message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"README.md","is_error":false}]}}
{"type":"end","reason":"answered","turns":2}"#;

#[test]
fn anthropic_messages_become_a_conversation() {
    let e = parse(ANTHROPIC);
    assert_eq!(e.len(), 5, "{e:?}");
    assert_eq!(
        e[0],
        Entry::Note("started: driver anthropic · model claude-x".into())
    );
    assert_eq!(
        e[2],
        Entry::Message {
            role: "assistant".into(),
            blocks: vec![
                Block::Text("looking".into()),
                Block::ToolCall {
                    name: "bash".into(),
                    input: "{\n  \"command\": \"ls\"\n}".into()
                }
            ]
        }
    );
    assert!(matches!(&e[3], Entry::Message { blocks, .. }
        if blocks == &[Block::ToolResult { text: "README.md".into(), is_error: false }]));
    assert_eq!(e[4], Entry::Note("ended: answered · 2 turns".into()));
}

#[test]
fn openai_calls_and_tool_messages() {
    let t = r#"{"type":"message","message":{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a\"}"}}]}}
{"type":"message","message":{"role":"tool","tool_call_id":"c","content":"hello"}}"#;
    let e = parse(t);
    assert!(
        matches!(&e[0], Entry::Message { role, blocks } if role == "assistant"
        && matches!(&blocks[0], Block::ToolCall { name, input } if name == "read_file" && input.contains("\"path\": \"a\"")))
    );
    assert!(matches!(&e[1], Entry::Message { blocks, .. }
        if blocks == &[Block::ToolResult { text: "hello".into(), is_error: false }]));
}

#[test]
fn command_output_lines_and_stream_json() {
    let t = r#"{"type":"output","text":"line one"}
{"type":"output","text":"line two"}
{"type":"output","event":{"type":"assistant","message":{"role":"assistant","content":[{"type":"text","text":"hi"}]}}}
{"type":"output","event":{"type":"result","result":"done"}}
{"type":"output","event":{"type":"other","x":1}}
not json"#;
    let e = parse(t);
    assert_eq!(e[0], Entry::Output("line one\nline two".into()));
    assert!(matches!(&e[1], Entry::Message { role, .. } if role == "assistant"));
    assert!(matches!(&e[2], Entry::Message { role, .. } if role == "result"));
    assert_eq!(
        e[3],
        Entry::Output("{\"type\":\"other\",\"x\":1}\nnot json".into())
    );
}

#[test]
fn rendered_escaped_and_long_parts_folded() {
    let long = "a long line ".repeat(50);
    let t = format!(
        "{}\n{}",
        serde_json::json!({"type":"message","message":{"role":"user","content":"<script>alert(1)</script>"}}),
        serde_json::json!({"type":"message","message":{"role":"assistant","content":[{"type":"tool_use","name":"bash","input":{"command": long}}]}})
    );
    let html = render(&t).into_string();
    assert!(html.contains("&lt;script&gt;alert(1)"), "{html}");
    assert!(!html.contains("<script>"), "{html}");
    assert!(
        html.contains("<details class=\"tool-call\">"),
        "a long input folded: {html}"
    );
    let short = render(ANTHROPIC).into_string();
    assert!(
        short.contains("<details class=\"tool-call\" open>"),
        "{short}"
    );
    assert!(render("").into_string().contains("No transcript"));
}
