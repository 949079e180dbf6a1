from slipstream.controller.main import main

main()
