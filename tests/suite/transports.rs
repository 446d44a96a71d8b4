//! The same process and filesystem tests as over a local pipe
//! (`process::*_on`, `fs::*_on`), run over a real OpenSSH sshd with the
//! system `ssh`, and over the native russh transport.

use executor_client::{Client, ClientOptions};
use executor_tests::executor_bin;
use executor_tests::sshd::Sshd;

/// `ssh -T 127.0.0.1 executor` through the test's own sshd.
pub async fn openssh() -> (Sshd, Client) {
    let sshd = Sshd::start("", "");
    let c = Client::connect_target(
        &executor_client::Target::ssh_with("127.0.0.1", sshd.options(&executor_bin())),
        ClientOptions::default(),
    )
    .await
    .expect("connect with ssh");
    (sshd, c)
}

/// russh, with the sshd's host key as the only known host.
pub async fn native() -> (Sshd, Client) {
    let sshd = Sshd::start("", "");
    let opts = sshd.native_options(&executor_bin());
    let c = Client::connect_native_ssh("127.0.0.1", &opts, ClientOptions::default())
        .await
        .expect("connect with russh");
    (sshd, c)
}

macro_rules! over {
    ($transport:ident: $($module:ident :: $test:ident),* $(,)?) => {
        mod $transport {
            $(
                #[tokio::test]
                async fn $test() {
                    let (_sshd, c) = super::$transport().await;
                    paste_on!($module, $test, &c);
                    c.close().await.unwrap();
                }
            )*
        }
    };
}

/// `module::test_on(client)`.
macro_rules! paste_on {
    ($module:ident, $test:ident, $c:expr) => {
        crate::$module::on::$test($c).await
    };
}

macro_rules! both {
    ($($module:ident :: $test:ident),* $(,)?) => {
        over!(openssh: $($module::$test),*);
        over!(native: $($module::$test),*);
    };
}

both!(
    process::echo_exit_codes_and_streams,
    process::death_by_signal_is_reported_as_signal,
    process::cat_echoes_stdin_until_close,
    process::tty_has_a_pts_and_resize_is_seen,
    process::interrupt_reaches_the_trap_and_its_exit_is_reported,
    process::every_signal_name_is_delivered_to_the_group,
    process::two_hundred_concurrent_processes_keep_their_own_output,
    process::process_ids_are_unique_and_listed_with_tags,
    fs::all_256_byte_values_round_trip,
    fs::errors_name_the_path,
    fs::walk_limits_truncate_and_cursors_resume_exactly,
    fs::a_5_mib_file_read_in_blocks_matches_its_sha256,
    fs::open_write_content_is_invisible_before_commit,
    fs::the_129th_handle_is_limit_exceeded_and_closing_frees_a_slot,
    fs::non_utf8_names_are_walked_and_read_back,
    fs::read_file_is_bounded_and_ranges_within_the_bound_work,
);
