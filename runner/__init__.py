"""The runner: carries out a compiled plan against real vLLM servers and stores every measurement."""
