"""The compiler: study files (TOML) checked and compiled into typed execution plans."""
